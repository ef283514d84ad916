"""Fit the serving runtimes' grouped expert-GEMM efficiency on published timings of Triton's ``fused_moe``.

``python -m validation.fit_moe_kernels [--data CSV] [--min-tokens 512] [--no-fit]``

vLLM and SGLang run a MoE layer's experts on Hopper through Triton's ``fused_moe``: tokens sorted by
expert and padded to ``BLOCK_SIZE_M`` per expert, one grouped kernel for the gate/up projection and one
for the down projection. Their kernel-tuning scripts (vLLM ``benchmarks/kernels/benchmark_moe.py``,
SGLang ``benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py``) print the time of one whole
call per token count ``M``; the pull requests that add tuned configs publish those prints. Each row of
``validation/data/kernels_fused_moe_published.csv`` is one (its ``source_url`` and ``note`` say where
and how ``E`` and ``N`` map to the model).

The cost model prices such a call as the lowering prices a MoE layer's experts: ``M x topk`` token
copies routed uniformly over ``E`` experts (the scripts draw random gating logits, so routing is
near-uniform), two grouped GEMMs (``2N x K`` then ``K x N`` per expert) by
:func:`simcore.lowering.expert_gemm_s`. The one parameter fitted is
``RuntimeProfile.moe_gemm_efficiency``: the tensor-core rate of these grouped kernels on their useful
work as a share of a dense GEMM's ``GpuSpec.gemm_efficiency``, chosen on a grid to minimise the median ``|log(model /
measured)|`` over rows with ``M >= --min-tokens`` (below that the calls are memory-bound and do not
depend on it). The calls' small kernels (routing, alignment, activation, sum) are not priced: a few
microseconds each, next to hundreds at these sizes.

Rows used: H100 and H200, ``kernel`` a Triton ``fused_moe``, and a kernel config the source states:
``config_kind`` neither ``superseded`` (a default heuristic the same pull request replaced) nor ``not
stated``. The shipped file's only unstated rows (vllm-project/vllm#13932, DeepSeek-V3 shapes in FP8 on
an H100, February 2025) are flat from 512 to 1,536 tokens at 2-4x the time their weights take to read
from HBM, so something other than the GEMMs bound them; with them the fit picks the grid's floor (0.20,
median ``|log error|`` 0.84). Fit rows only (:func:`validation.split.refuse_test_rows`);
``--no-fit`` scores the shipped value on any rows. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np

from simcore.hardware import get_gpu
from simcore.lowering import expert_gemm_s, routed_experts
from simcore.serving import get_runtime
from validation.split import refuse_test_rows

__all__ = ["main", "fused_moe_s", "load_rows", "GRID"]

_DATA = Path(__file__).resolve().parent / "data" / "kernels_fused_moe_published.csv"
GRID = tuple(round(0.2 + 0.05 * i, 2) for i in range(17))  # 0.20 .. 1.00
_GPUS = {"H100": "h100-sxm", "H200": "h200"}


def fused_moe_s(gpu, tokens: int, experts: int, n: int, k: int, topk: int, precision: str,
                moe_gemm_efficiency: float = 1.0) -> float:
    """Modelled seconds of one ``fused_moe`` call (module doc), priced as the lowering prices experts."""
    rate = get_runtime("vllm").with_overrides(moe_gemm_efficiency=moe_gemm_efficiency).expert_flops_per_s(
        gpu, precision)
    p_active, per_expert = routed_experts(tokens * topk, experts)
    active = experts * p_active
    gate_up = expert_gemm_s(per_expert, 2 * n, k, active, gpu, precision, flops_per_s=rate)
    down = expert_gemm_s(per_expert, k, n, active, gpu, precision, flops_per_s=rate)
    return float(gate_up + down)


def load_rows(path: Path) -> list[dict]:
    """The rows the fit can use (module doc), each with ``gpu_spec``, the ints and ``seconds``."""
    try:
        with Path(path).open(newline="") as f:
            raw = list(csv.DictReader(f))
    except OSError as exc:
        raise SystemExit(f"error: --data {path}: {exc.strerror or exc}") from None
    need = ("source_url", "gpu", "kernel", "E", "N", "hidden_K", "topk", "dtype", "M_tokens", "time_us")
    missing = [c for c in need if raw and c not in raw[0]]
    if missing:
        raise SystemExit(f"error: --data {path}: missing column(s) {', '.join(missing)}")
    rows = []
    for line, r in enumerate(raw, start=2):
        gpu = _GPUS.get(r["gpu"].strip().upper()[:4])
        kind = r.get("config_kind", "").strip()
        if gpu is None or "fused_moe" not in r["kernel"] or kind.startswith(("superseded", "not stated")):
            continue
        try:
            ints = {c: int(r[c]) for c in ("E", "N", "hidden_K", "topk", "M_tokens")}
            seconds = float(r["time_us"]) * 1e-6
        except ValueError as exc:
            raise SystemExit(f"error: --data {path}, line {line}: {exc}") from None
        precision = "fp8" if "fp8" in r["dtype"].lower() else "bf16"
        rows.append(dict(r, gpu_spec=get_gpu(gpu), precision=precision, seconds=seconds, line=line, **ints))
    return rows


def _errors(rows: list[dict], efficiency: float) -> list[float]:
    return [math.log(fused_moe_s(r["gpu_spec"], r["M_tokens"], r["E"], r["N"], r["hidden_K"], r["topk"],
                                 r["precision"], efficiency) / r["seconds"]) for r in rows]


def _median_abs(errors: list[float]) -> float:
    return float(np.median(np.abs(errors))) if errors else math.nan


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--min-tokens", type=int, default=512, help="rows with M at least this many tokens")
    parser.add_argument("--no-fit", action="store_true", help="score the shipped vLLM value, fit nothing")
    args = parser.parse_args(argv)
    rows = load_rows(args.data)
    big = [r for r in rows if r["M_tokens"] >= args.min_tokens]
    if not big:
        raise SystemExit(f"error: --data {args.data}: no usable row with M >= {args.min_tokens}")
    shipped = get_runtime("vllm").moe_gemm_efficiency
    if args.no_fit:
        chosen, scores = shipped, {shipped: _median_abs(_errors(big, shipped))}
    else:
        refuse_test_rows(big, args.data)
        scores = {e: _median_abs(_errors(big, e)) for e in GRID}
        chosen = min(scores, key=scores.get)
        print("moe_gemm_efficiency  " + "  ".join(f"{e:.2f}:{s:.3f}" for e, s in scores.items()))
    errs = _errors(big, chosen)
    for r, e in zip(big, errs, strict=True):
        print(f"line {r['line']:4d} {r['gpu']:16.16s} {r['model'][:28]:28s} E={r['E']:<4d} N={r['N']:<5d} "
              f"K={r['hidden_K']:<5d} top{r['topk']:<2d} {r['precision']:4s} M={r['M_tokens']:<6d} "
              f"measured {r['seconds'] * 1e6:8.1f} us  model {r['seconds'] * math.exp(e) * 1e6:8.1f} us")
    result = {"moe_gemm_efficiency": chosen, "rows": len(big), "min_tokens": args.min_tokens,
              "median_abs_log_error": scores[chosen], "median_abs_log_error_at_1": _median_abs(_errors(big, 1.0)),
              "sources": len({r["source_url"] for r in big}), "signed_median_log_error": float(np.median(errs))}
    print(f"{len(big)} rows (M >= {args.min_tokens}, {result['sources']} sources): moe_gemm_efficiency "
          f"{chosen:.2f}, median |log error| {scores[chosen]:.3f} (at 1.0: {result['median_abs_log_error_at_1']:.3f})")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
