"""Fit the one runtime parameter the kernel and collective fits cannot see: the host/runtime time of a
forward pass (``GpuSpec.iteration_overhead_s``: scheduling, sampling, launch gaps between kernels).

``python -m validation.fit_inference [--data PATH]``: for a grid of values, predicts every usable row
of an inference CSV (schema of ``inference_calibration.csv``) with the proxy and keeps the value with
the lowest median |log(predicted / measured)|. One scalar for all rows, never per-row factors. Ends
with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
from pathlib import Path

import numpy as np

from simcore.proxy import evaluate
from validation.studies.inference import _metric, parse_row

__all__ = ["main", "fit"]

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "inference_calibration.csv"


def _cases(path: Path):
    cases, skipped = [], 0
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                cases.append(parse_row(row))
            except (ValueError, KeyError):
                skipped += 1
    return cases, skipped


def _errors(cases, overhead_s: float) -> list[float]:
    out = []
    for case in cases:
        gpu = case.ctx.cluster.gpu.with_overrides(iteration_overhead_s=overhead_s)
        cluster = dataclasses.replace(case.ctx.cluster, gpu=gpu)
        ctx = dataclasses.replace(case.ctx, cluster=cluster)
        pred = _metric(case, evaluate(ctx, case.strategy))
        out.append(math.log(pred / case.value))
    return out


def fit(cases, grid_s=None) -> tuple[float, dict[float, float]]:
    """The overhead with the lowest median |log error|, and the whole curve."""
    grid_s = np.arange(0.0, 6.01e-3, 0.25e-3) if grid_s is None else grid_s
    curve = {float(g): statistics.median(abs(e) for e in _errors(cases, float(g))) for g in grid_s}
    best = min(curve, key=curve.get)
    return best, curve


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    cases, skipped = _cases(args.data)
    if not cases:
        raise SystemExit(f"no usable rows in {args.data}")
    best, curve = fit(cases)
    for g, err in curve.items():
        print(f"iteration_overhead {g * 1e3:5.2f} ms: median |error| {math.expm1(err):6.1%}"
              + ("   <- best" if g == best else ""))
    errors = _errors(cases, best)
    figures = {"iteration_overhead_s": best, "rows_used": len(cases), "rows_skipped": skipped,
               "median_abs_rel_error": math.expm1(statistics.median(abs(e) for e in errors)),
               "median_abs_rel_error_at_zero": math.expm1(curve[min(curve)])}
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
