"""Fit the serving runtimes' grouped expert-GEMM efficiency on timings of their MoE kernels.

``python -m validation.studies.moe.fit_kernels [--runtime vllm|trtllm] [--data CSV] [--min-tokens N] [--no-fit]
[--decode [--max-tokens N]]``

``--runtime vllm`` (the default; SGLang shares the value): vLLM and SGLang run a MoE layer's experts on
Hopper through Triton's ``fused_moe``: tokens sorted by expert and padded to ``BLOCK_SIZE_M`` per expert,
one grouped kernel for the gate/up projection and one for the down projection. Their kernel-tuning
scripts (vLLM ``benchmarks/kernels/benchmark_moe.py``, SGLang
``benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py``) print the time of one whole call per
token count ``M``; the pull requests that add tuned configs publish those prints. Each row of
``validation/data/kernels_fused_moe_published.csv`` is one (its ``source_url`` and ``note`` say where
and how ``E`` and ``N`` map to the model). The cost model prices such a call as the lowering prices a MoE
layer's experts: ``M x topk`` token copies routed uniformly over ``E`` experts (the scripts draw random
gating logits, so routing is near-uniform), two grouped GEMMs (``2N x K`` then ``K x N`` per expert) by
:func:`simcore.cost.lowering.expert_gemm_s`; rows with ``M >= --min-tokens`` (512 by default) count. The
calls' small kernels (routing, alignment, activation, sum) are not priced: a few microseconds each, next
to hundreds at these sizes.

``--runtime trtllm``: TensorRT-LLM runs its experts as CUTLASS grouped GEMMs (TMA, warp-specialized).
The rows are this project's own H100 timings of that kernel family, ``torch._grouped_mm`` (CUTLASS's sm90
grouped GEMM; ``python -m validation.studies.moe.measure_kernels``, kernels schema, ``validation/data/
kernels_h100_moe_measured.csv``): ``b`` experts of ``m`` tokens each, one grouped GEMM, priced by
:func:`~simcore.cost.lowering.expert_gemm_s` directly; BF16 rows with ``m >= --min-tokens`` (128 by default,
the prefill regime) count. The FP8 rows (``torch._scaled_grouped_mm``, row-wise scales) are not used:
that path runs a 512-token group slower than a 2,048-token one on several shapes, a kernel-selection
artefact of PyTorch's rather than a property of CUTLASS's FP8 grouped GEMM.

The one parameter fitted is ``RuntimeProfile.moe_gemm_efficiency``: the tensor-core rate of these
grouped kernels on their useful work as a share of a dense GEMM's ``GpuSpec.gemm_efficiency``, chosen on
a grid to minimise the median ``|log(model / measured)|`` (below the token threshold the kernels are
memory-bound and do not depend on it).

``--decode`` (Triton ``fused_moe`` rows at decode sizes, ``M <= --max-tokens``, 64 by default): the
two constants of the runtimes' MoE block at decode sizes, ``RuntimeProfile.moe_memory_efficiency`` (the
grouped kernels' HBM bandwidth on the active experts' weights, a share of a dense GEMM's) and
``moe_layer_s`` (the call's fixed time: routing, alignment, activation, sum, the grids' ramp), fitted
jointly on :data:`GRID_DECODE_EFFICIENCY` x :data:`GRID_DECODE_FIXED_S` on these kernel timings alone,
each call priced as the lowering prices one MoE layer's experts plus that fixed time. The serving
profiles fitted the same two constants on serving rows (``python -m validation.studies.serving.fit --moe``);
this prints how the shipped vLLM and SGLang values score on the kernels, so the two sources can be
compared. Its pair is what the serving study gives a runtime that runs Triton's MoE kernels in place of
its own (``simcore.serving.deployment.moe_kernels.TRITON_FUSED_MOE_DECODE``: TensorRT-LLM's MXFP4 experts
on Hopper); the profiles keep their serving fits.

Rows used for ``vllm``: H100 and H200, ``kernel`` a Triton ``fused_moe``, and a kernel config the source
states: ``config_kind`` neither ``superseded`` (a default heuristic the same pull request replaced) nor
``not stated``. The shipped file's only unstated rows (vllm-project/vllm#13932, DeepSeek-V3 shapes in FP8
on an H100, February 2025) are flat from 512 to 1,536 tokens at 2-4x the time their weights take to read
from HBM, so something other than the GEMMs bound them; with them the fit picks the grid's floor (0.20,
median ``|log error|`` 0.84). Fit rows only (:func:`validation.studies.common.split.refuse_test_rows`); ``--no-fit``
scores the shipped value on any rows. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np

from simcore.cost.lowering import expert_gemm_s, routed_experts
from simcore.files import dumps
from simcore.hardware.gpus import get_gpu
from simcore.serving import get_runtime
from validation.studies.common import read_csv
from validation.studies.common.cli import BadInput, run_script
from validation.studies.common.split import refuse_test_rows
from validation.studies.kernels.measure import HARDWARE

__all__ = ["main", "fused_moe_s", "grouped_gemm_s", "load_rows", "load_grouped_rows", "GRID"]

_DATA = Path(__file__).resolve().parents[2] / "data" / "kernels_fused_moe_published.csv"
_GROUPED_DATA = Path(__file__).resolve().parents[2] / "data" / "kernels_h100_moe_measured.csv"
GRID = tuple(round(0.2 + 0.05 * i, 2) for i in range(17))  # 0.20 .. 1.00
GRID_DECODE_EFFICIENCY = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.35)
GRID_DECODE_FIXED_S = tuple(i * 5e-6 for i in range(17))  # 0 .. 80 us
_GPUS = {"H100": "h100-sxm", "H200": "h200"}
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _rate(runtime: str, gpu, precision: str, efficiency: float) -> float | None:
    return get_runtime(runtime).with_overrides(moe_gemm_efficiency=efficiency).expert_flops_per_s(gpu, precision)


def fused_moe_s(gpu, tokens: int, experts: int, n: int, k: int, topk: int, precision: str,
                moe_gemm_efficiency: float = 1.0, moe_memory_efficiency: float = 1.0) -> float:
    """Modelled seconds of one ``fused_moe`` call's expert GEMMs (module doc), priced as the lowering
    prices experts, at the runtime's tensor-core rate and HBM bandwidth shares."""
    runtime = get_runtime("vllm").with_overrides(moe_gemm_efficiency=moe_gemm_efficiency,
                                                 moe_memory_efficiency=moe_memory_efficiency)
    rate, bandwidth = runtime.expert_flops_per_s(gpu, precision), runtime.expert_bytes_per_s(gpu)
    p_active, per_expert = routed_experts(tokens * topk, experts)
    active = experts * p_active
    gate_up = expert_gemm_s(per_expert, 2 * n, k, active, gpu, precision, flops_per_s=rate, bytes_per_s=bandwidth)
    down = expert_gemm_s(per_expert, k, n, active, gpu, precision, flops_per_s=rate, bytes_per_s=bandwidth)
    return float(gate_up + down)


def decode_call_s(r: dict, runtime) -> float:
    """Modelled seconds of a decode-size ``fused_moe`` row under ``runtime``'s MoE block: its expert
    GEMMs (:func:`fused_moe_s`) plus its fixed time per MoE layer (``moe_layer_s``)."""
    return runtime.moe_layer_s + fused_moe_s(r["gpu_spec"], r["M_tokens"], r["E"], r["N"], r["hidden_K"], r["topk"],
                                             r["precision"], runtime.moe_gemm_efficiency,
                                             runtime.moe_memory_efficiency)


def grouped_gemm_s(gpu, b: int, m: int, n: int, k: int, precision: str, moe_gemm_efficiency: float = 1.0) -> float:
    """Modelled seconds of one CUTLASS grouped GEMM of ``b`` experts x ``m`` tokens (module doc)."""
    rate = _rate("trtllm", gpu, precision, moe_gemm_efficiency)
    return float(expert_gemm_s(m, n, k, b, gpu, precision, flops_per_s=rate))


def _read(path: Path, need: tuple[str, ...]) -> list[dict]:
    try:
        return read_csv(path, need, "--data")[1]
    except OSError as exc:
        raise BadInput(f"error: --data {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BadInput(f"error: {exc}") from None


def load_rows(path: Path) -> list[dict]:
    """The Triton ``fused_moe`` rows the fit can use (module doc), each with ``gpu_spec``, the ints,
    ``seconds`` and ``tokens`` (``M``)."""
    raw = _read(path, ("source_url", "gpu", "kernel", "E", "N", "hidden_K", "topk", "dtype", "M_tokens",
                       "time_us"))
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
            raise BadInput(f"error: --data {path}, line {line}: {exc}") from None
        precision = "fp8" if "fp8" in r["dtype"].lower() else "bf16"
        rows.append(dict(r, gpu_spec=get_gpu(gpu), precision=precision, seconds=seconds, line=line,
                         tokens=ints["M_tokens"], **ints))
    return rows


def load_grouped_rows(path: Path, dtype: str = "BF16") -> list[dict]:
    """The kernels-schema grouped-GEMM rows (``b= m= n= k=``) of ``dtype`` on a catalog GPU named in
    ``source_url`` or ``note``, each with ``gpu_spec``, ``b m n k``, ``seconds`` and ``tokens`` (``m``)."""
    raw = _read(path, ("source_url", "kernel", "shape_or_size", "dtype", "value", "unit", "note"))
    rows = []
    for line, r in enumerate(raw, start=2):
        where = f"{r['source_url']} {r['note']}"
        gpu = next((name for key, name in HARDWARE.items() if key in where), None)
        if gpu is None or "grouped" not in r["kernel"].lower() or r["dtype"].strip() != dtype:
            continue
        shape = dict(re.findall(r"\b([bmnk])=(\d+)", r["shape_or_size"]))
        try:
            ints = {c: int(shape[c]) for c in "bmnk"}
            seconds = float(r["value"]) * _UNIT_S[r["unit"].strip()]
        except (KeyError, ValueError) as exc:
            raise BadInput(f"error: --data {path}, line {line}: shape_or_size/value/unit: {exc}") from None
        rows.append(dict(r, gpu_spec=get_gpu(gpu), gpu=gpu, precision="fp8" if "fp8" in dtype.lower() else "bf16",
                         seconds=seconds, line=line, tokens=ints["m"], **ints))
    return rows


#: per runtime: default data, loader, default token threshold, model seconds of a row at an efficiency
_SOURCES = {
    "vllm": (_DATA, load_rows, 512, lambda r, e: fused_moe_s(r["gpu_spec"], r["M_tokens"], r["E"], r["N"],
                                                             r["hidden_K"], r["topk"], r["precision"], e)),
    "trtllm": (_GROUPED_DATA, load_grouped_rows, 128,
               lambda r, e: grouped_gemm_s(r["gpu_spec"], r["b"], r["m"], r["n"], r["k"], r["precision"], e)),
}


def _describe(r: dict) -> str:
    if "E" in r:
        return (f"{r['gpu']:16.16s} {r['model'][:28]:28s} E={r['E']:<4d} N={r['N']:<5d} K={r['hidden_K']:<5d} "
                f"top{r['topk']:<2d} {r['precision']:4s} M={r['M_tokens']:<6d}")
    return f"{r['gpu']:10s} {r['note'].split('; ')[-1].split(':')[0][:30]:30s} b={r['b']:<4d} m={r['m']:<5d} n={r['n']:<5d} k={r['k']:<5d}"


def _median_abs(errors: list[float]) -> float:
    return float(np.median(np.abs(errors))) if errors else math.nan


def fit_decode(rows: list[dict]) -> dict:
    """The decode fit (module doc) on ``rows`` (:func:`load_rows`'s): the grid point with the least median
    ``|log(model / measured)|``, and how each shipped Triton profile scores."""
    base = get_runtime("vllm")

    def score(efficiency: float, fixed_s: float) -> float:
        runtime = base.with_overrides(moe_memory_efficiency=efficiency, moe_layer_s=fixed_s)
        return _median_abs([math.log(decode_call_s(r, runtime) / r["seconds"]) for r in rows])

    scores = {(e, f): score(e, f) for e in GRID_DECODE_EFFICIENCY for f in GRID_DECODE_FIXED_S}
    efficiency, fixed_s = min(scores, key=scores.get)
    shipped = {name: {"moe_memory_efficiency": get_runtime(name).moe_memory_efficiency,
                      "moe_layer_s": get_runtime(name).moe_layer_s,
                      "median_abs_log_error": score(get_runtime(name).moe_memory_efficiency,
                                                    get_runtime(name).moe_layer_s)}
               for name in ("vllm", "sglang")}
    return {"moe_memory_efficiency": efficiency, "moe_layer_s": fixed_s, "median_abs_log_error": scores[efficiency,
            fixed_s], "rows": len(rows), "sources": len({r["source_url"] for r in rows}), "shipped": shipped}


def _main_decode(data: Path, max_tokens: int, no_fit: bool) -> dict:
    rows = [r for r in load_rows(data) if r["tokens"] <= max_tokens]
    if not rows:
        raise BadInput(f"error: --data {data}: no usable fused_moe row with at most {max_tokens} tokens")
    if not no_fit:
        refuse_test_rows(rows, data)
    result = fit_decode(rows)
    best = get_runtime("vllm").with_overrides(moe_memory_efficiency=result["moe_memory_efficiency"],
                                              moe_layer_s=result["moe_layer_s"])
    for r in rows:
        print(f"line {r['line']:4d} {_describe(r)}  measured {r['seconds'] * 1e6:8.1f} us  "
              f"model {decode_call_s(r, best) * 1e6:8.1f} us")
    print(f"decode: {len(rows)} rows (<= {max_tokens} tokens, {result['sources']} sources): moe_memory_efficiency "
          f"{result['moe_memory_efficiency']:.2f}, moe_layer_s {result['moe_layer_s'] * 1e6:.0f} us, median |log "
          f"error| {result['median_abs_log_error']:.3f}")
    for name, s in result["shipped"].items():
        print(f"  shipped {name:6s} ({s['moe_memory_efficiency']:.2f}, {s['moe_layer_s'] * 1e6:.0f} us, fitted on "
              f"serving rows): median |log error| {s['median_abs_log_error']:.3f}")
    result |= {"mode": "decode", "max_tokens": max_tokens}
    print(dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=sorted(_SOURCES), default="vllm",
                        help="vllm: Triton fused_moe rows (SGLang shares it); trtllm: CUTLASS grouped GEMM rows")
    parser.add_argument("--data", type=Path, default=None, help="CSV (default: the runtime's shipped file)")
    parser.add_argument("--min-tokens", type=int, default=None,
                        help="rows with at least this many tokens (per call for vllm, per expert for trtllm)")
    parser.add_argument("--no-fit", action="store_true", help="score the shipped value, fit nothing")
    parser.add_argument("--decode", action="store_true",
                        help="fit the MoE block at decode sizes on the fused_moe rows (module doc)")
    parser.add_argument("--max-tokens", type=int, default=64, help="with --decode: rows with at most this many tokens")
    args = parser.parse_args(argv)
    if args.decode:
        if args.runtime != "vllm":
            raise BadInput("error: --decode: the decode fit reads Triton fused_moe rows (--runtime vllm)")
        return _main_decode(args.data or _DATA, args.max_tokens, args.no_fit)
    default_data, load, default_min, model_s = _SOURCES[args.runtime]
    data = args.data or default_data
    min_tokens = default_min if args.min_tokens is None else args.min_tokens
    big = [r for r in load(data) if r["tokens"] >= min_tokens]
    if not big:
        raise BadInput(f"error: --data {data}: no usable row with at least {min_tokens} tokens")

    def errors(efficiency: float) -> list[float]:
        return [math.log(model_s(r, efficiency) / r["seconds"]) for r in big]

    shipped = get_runtime(args.runtime).moe_gemm_efficiency
    if args.no_fit:
        chosen, scores = shipped, {shipped: _median_abs(errors(shipped))}
    else:
        refuse_test_rows(big, data)
        scores = {e: _median_abs(errors(e)) for e in GRID}
        chosen = min(scores, key=scores.get)
        print("moe_gemm_efficiency  " + "  ".join(f"{e:.2f}:{s:.3f}" for e, s in scores.items()))
    errs = errors(chosen)
    for r, e in zip(big, errs, strict=True):
        print(f"line {r['line']:4d} {_describe(r)}  measured {r['seconds'] * 1e6:8.1f} us  "
              f"model {r['seconds'] * math.exp(e) * 1e6:8.1f} us")
    result = {"runtime": args.runtime, "moe_gemm_efficiency": chosen, "rows": len(big), "min_tokens": min_tokens,
              "median_abs_log_error": scores[chosen], "median_abs_log_error_at_1": _median_abs(errors(1.0)),
              "sources": len({r["source_url"] for r in big}), "signed_median_log_error": float(np.median(errs))}
    print(f"{args.runtime}: {len(big)} rows (>= {min_tokens} tokens, {result['sources']} sources): "
          f"moe_gemm_efficiency {chosen:.2f}, median |log error| {scores[chosen]:.3f} "
          f"(at 1.0: {result['median_abs_log_error_at_1']:.3f})")
    print(dumps(result))
    return result


if __name__ == "__main__":
    run_script(main)
