"""Fit the kernel model's few physical parameters on published single-GPU measurements.

``python -m validation.studies.kernels.fit [--data PATH] [--gpu NAME] [--no-rows]``

Reads any CSV in the ``kernels_h100.csv`` schema as measured kernel times (:mod:`.rows`) and fits by
least squares on log time of the model's predictions (:mod:`.model`):

* ``gemm_efficiency["bf16"]`` (XLA BF16 and torch BF16 GEMM rows), ``gemm_efficiency["fp8"]``
  (cuBLASLt, DeepGEMM and torch FP8 rows), ``hbm_efficiency`` (STREAM rows and memory-bound
  GEMMs), ``attention_efficiency`` (fused attention rows), ``kernel_overhead_s`` (all sized rows);
* ``gemm_tile`` by grid search over ``--tiles``;
* then ``DECODE_ATTENTION_FILL_S`` (``simcore.hardware.kernels``): the median residual of decode attention rows.

Each kernel family gets equal total weight, so the 375 XLA rows do not drown the 5 STREAM rows.
Error figures are on time: relative error ``pred / meas - 1``; "geomean |err|" is
``exp(mean |ln(pred / meas)|) - 1``. Rows it cannot use are listed with the reason. The output
ends with one JSON line. Deterministic: fixed start point, no randomness.

It fits on fit rows only: a test row (``validation/studies/common/split.py``) is a one-line error. ``--no-fit``
scores the catalog's constants on any rows and gives every figure per split with its row count.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simcore.files import dumps
from simcore.hardware.gpus import GpuSpec, get_gpu
from simcore.hardware.kernels import DECODE_ATTENTION_FILL_S
from validation.studies.common.cli import BadInput, run_script
from validation.studies.common.split import refuse_test_rows, split_label
from validation.studies.kernels.model import evaluate, predicted_over_measured
from validation.studies.kernels.rows import DEFAULT_DATA, FAMILIES, Sample, load_samples

__all__ = ["fit", "fit_decode_fill", "main"]

#: Start point of the fit (eff_bf16, eff_fp8, hbm_eff, attn_eff, overhead_us): fixed, so the result does
#: not depend on the defaults currently in hardware.py.
_X0 = np.array([0.75, 0.65, 0.90, 0.55, 4.0])


def _with_params(gpu: GpuSpec, x: np.ndarray, tile: int) -> GpuSpec:
    return gpu.with_overrides(gemm_efficiency={"bf16": float(x[0]), "fp8": float(x[1])},
                              hbm_efficiency=float(x[2]), attention_efficiency=float(x[3]),
                              kernel_overhead_s=float(x[4]) * 1e-6, gemm_tile=int(tile))


def _free_params(samples: list[Sample]) -> np.ndarray:
    """Which parameters the data can determine; the others keep the GPU's current values."""
    families = {s.family for s in samples}
    sized = any(s.measured_s is not None for s in samples)
    attn_compute = any(s.op == "attention" and (s.measured_s is not None or s.bound == "compute")
                       for s in samples)
    return np.array(["gemm_bf16" in families, "gemm_fp8" in families,
                     bool(families & {"hbm", "gemm_bf16", "gemm_fp8"}), attn_compute, sized])


def fit(samples: list[Sample], gpu: GpuSpec,
        tiles: tuple[int, ...] = (64, 128, 256)) -> tuple[GpuSpec, float]:
    """Least squares on log time, family-weighted; returns the fitted GpuSpec and its cost. Decode
    attention rows are left to :func:`fit_decode_fill` (their fixed latency is its own parameter)."""
    samples = [s for s in samples if not s.decode]
    counts = {f: sum(s.family == f for s in samples) for f in FAMILIES}
    weights = np.array([1.0 / np.sqrt(counts[s.family]) for s in samples])
    free = _free_params(samples)
    x_base = np.array([gpu.gemm_efficiency["bf16"], gpu.gemm_efficiency["fp8"], gpu.hbm_efficiency,
                       gpu.attention_efficiency, gpu.kernel_overhead_s * 1e6])
    lower, upper = np.array([0.05] * 4 + [0.0]), np.array([1.0] * 4 + [100.0])
    x_start = np.where(free, _X0, x_base)
    best: tuple[float, GpuSpec] | None = None
    for tile in tiles:
        def residuals(free_x: np.ndarray, tile: int = tile) -> np.ndarray:
            x = x_base.copy()
            x[free] = free_x
            return weights * np.log(predicted_over_measured(samples, _with_params(gpu, x, tile)))

        result = least_squares(residuals, x_start[free],
                               bounds=(lower[free], upper[free]), x_scale="jac")
        x = x_base.copy()
        x[free] = result.x
        if best is None or result.cost < best[0] - 1e-12:
            best = (float(result.cost), _with_params(gpu, x, tile))
    assert best is not None
    return best[1], best[0]


def fit_decode_fill(samples: list[Sample], gpu: GpuSpec) -> float | None:
    """``DECODE_ATTENTION_FILL_S``: the median time decode attention rows take beyond the kernel model
    without it (None without sized decode rows)."""
    decode = [s for s in samples if s.decode and s.measured_s is not None]
    if not decode:
        return None
    base = predicted_over_measured(decode, gpu, fill_s=0.0) * [s.measured_s for s in decode]
    return max(float(np.median([s.measured_s for s in decode] - base)), 0.0)


def _print_rows(samples: list[Sample], ratio: np.ndarray) -> None:
    print(f"{'line':>5} {'family':<10} {'kernel':<44} {'shape':<34} {'meas':>10} {'pred':>10} {'err':>7}")
    for s, r in zip(samples, ratio, strict=True):
        if s.measured_s is None:  # asymptotic row: rates in FLOP/s (F) or bytes/s (B)
            unit = "B" if s.bound == "memory" or s.op == "memory" else "F"
            cells = f"{s.measured_rate:9.3g}{unit} {s.measured_rate / r:9.3g}{unit}"
        else:
            cells = f"{s.measured_s * 1e6:8.1f}us {s.measured_s * r * 1e6:8.1f}us"
        print(f"{s.line:>5} {s.family:<10} {s.kernel[:44]:<44} {s.shape[:34]:<34} {cells} {r - 1:+7.1%}")


def _print_kernels(samples: list[Sample], ratio: np.ndarray) -> None:
    """Median signed and absolute error per kernel name (the family's sources, for bias hunting)."""
    print(f"\n{'kernel':<66} {'rows':>4} {'median err':>10} {'median|err|':>11}")
    for kernel in dict.fromkeys(s.kernel for s in samples):
        r = ratio[[s.kernel == kernel for s in samples]] - 1.0
        print(f"{kernel[:66]:<66} {r.size:>4} {np.median(r):>+10.1%} {np.median(np.abs(r)):>11.1%}")


def _report(gpu: GpuSpec) -> dict[str, float]:
    return {"gemm_efficiency_bf16": round(gpu.gemm_efficiency["bf16"], 4),
            "gemm_efficiency_fp8": round(gpu.gemm_efficiency["fp8"], 4),
            "hbm_efficiency": round(gpu.hbm_efficiency, 4),
            "attention_efficiency": round(gpu.attention_efficiency, 4),
            "kernel_overhead_s": float(f"{gpu.kernel_overhead_s:.4g}"), "gemm_tile": gpu.gemm_tile}


def _rounded(stats: dict[str, dict]) -> dict[str, dict]:
    return {f: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in st.items()} for f, st in stats.items()}


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="+", default=[DEFAULT_DATA],
                        help="one or more CSVs in the kernels_h100.csv schema (fitted together)")
    parser.add_argument("--gpu", default="h100-sxm", help="catalog GPU the rows were measured on")
    parser.add_argument("--tiles", default="64,128,256", help="gemm_tile candidates, comma separated")
    parser.add_argument("--no-rows", action="store_true", help="omit the per-row table")
    parser.add_argument("--no-fit", action="store_true",
                        help="score the catalog GPU's current parameters on the data (out-of-sample check)")
    args = parser.parse_args(argv)
    samples, skipped = [], []
    for path in args.data:
        if not path.is_file():
            raise BadInput(f"error: --data: no such file {path}")
        if not args.no_fit:  # constants are fitted on fit rows only
            with open(path, newline="") as handle:
                refuse_test_rows(csv.DictReader(handle), path)
        try:
            used, dropped = load_samples(path, "--data")
        except ValueError as exc:
            raise BadInput(f"error: {exc}") from None
        samples += used
        prefix = f"{path.name}:" if len(args.data) > 1 else ""
        skipped += [(f"{prefix}{line}", kernel, reason) for line, kernel, reason in dropped]
    if not samples:
        raise BadInput(f"error: --data: no usable rows in {', '.join(map(str, args.data))}")
    if args.no_fit:
        fitted, cost, fill_s = get_gpu(args.gpu), float("nan"), DECODE_ATTENTION_FILL_S
    else:
        fitted, cost = fit(samples, get_gpu(args.gpu), tuple(int(t) for t in args.tiles.split(",")))
        fill_s = fit_decode_fill(samples, fitted)
        fill_s = DECODE_ATTENTION_FILL_S if fill_s is None else fill_s
    ratio, stats = evaluate(samples, fitted, fill_s)
    if not args.no_rows:
        _print_rows(samples, ratio)
        _print_kernels(samples, ratio)
    reasons: dict[str, list[int]] = {}
    for line, _kernel, reason in skipped:
        reasons.setdefault(reason, []).append(line)
    print(f"\nrows used {len(samples)}, skipped {len(skipped)}:")
    for reason, lines in sorted(reasons.items()):
        shown = ", ".join(map(str, lines[:6])) + (", ..." if len(lines) > 6 else "")
        print(f"  skipped {len(lines):4d}: {reason} (lines {shown})")
    splits = sorted({s.split for s in samples}, key=lambda name: name != "test")
    by_split = {name: evaluate([s for s in samples if s.split == name], fitted, fill_s)[1] for name in splits}
    for name, split_stats in by_split.items():
        rows = sum(s.split == name for s in samples)
        print(f"\n{split_label(name, rows)}\nfamily       rows  median|err|  geomean|err|  median err")
        for family, st in split_stats.items():
            print(f"{family:<12} {st['rows']:>4}  {st['median_abs_rel_err']:>10.1%}"
                  f"  {st['geomean_abs_err']:>11.1%}  {st['median_rel_err']:>+10.1%}")
    params = _report(fitted) | {"decode_attention_fill_s": float(f"{fill_s:.4g}")}
    print("\ncatalog (not fitted):" if args.no_fit else "\nfitted:", ", ".join(f"{k}={v}" for k, v in params.items()), f"(cost {cost:.4g})")
    summary = {"data": [str(p) for p in args.data], "gpu": args.gpu, "fitted": not args.no_fit, "rows_used": len(samples),
               "rows_skipped": len(skipped),
               "skipped": {reason: len(lines) for reason, lines in sorted(reasons.items())}, "params": params,
               "families": _rounded(stats),
               "by_split": {name: _rounded(st) for name, st in by_split.items()}}
    print(dumps(summary))
    return summary


if __name__ == "__main__":
    run_script(main)
