"""Fit the two runtime parameters the kernel and collective fits cannot see, on fit rows only.

``python -m validation.fit_inference [--data PATH ...]``

* ``GpuSpec.iteration_overhead_s``: the host/runtime time of a forward pass (scheduling, sampling,
  launch gaps between kernels), on every usable row;
* ``MMHA_KV_REREAD`` (``validation.studies.inference``, a ``Workload.decode_kv_reread``): the fraction
  of a KV head each further query head of its group re-reads from HBM under TensorRT-LLM's masked-MHA
  decode kernel (before XQA), on the rows that run it.

Each is the grid value with the lowest median |log(predicted / measured)| of the proxy: the re-read
at the catalog's overhead, then the overhead at that re-read. Two scalars for all rows, never
per-row factors. The data must be
fit rows (``validation/split.py``): a test row is a one-line error. Ends with one JSON line.
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
from validation.split import refuse_test_rows
from validation.studies import inference
from validation.studies.inference import _metric, decode_kv_reread, parse_row

__all__ = ["main", "fit", "fit_reread"]

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "inference_calibration.csv"
OVERHEAD_GRID_S = np.arange(0.0, 6.01e-3, 0.25e-3)
REREAD_GRID = np.round(np.arange(0.0, 1.001, 0.05), 2)


def _cases(paths: list[Path]):
    """(case, row) of every usable row, and the number skipped; refuses test rows."""
    cases, skipped = [], 0
    for path in paths:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        refuse_test_rows(rows, path)
        for row in rows:
            try:
                cases.append((parse_row(row), row))
            except (ValueError, KeyError):
                skipped += 1
    return cases, skipped


def _errors(cases, overhead_s: float, reread: float) -> list[float]:
    """log(pred / meas) of every case with these two parameters."""
    out = []
    for case, row in cases:
        gpu = case.ctx.cluster.gpu.with_overrides(iteration_overhead_s=overhead_s)
        # the row's runtime generation decides whether the re-read applies
        workload = dataclasses.replace(case.ctx.workload, decode_kv_reread=decode_kv_reread(row, case.ctx.model, reread))
        ctx = dataclasses.replace(case.ctx, cluster=dataclasses.replace(case.ctx.cluster, gpu=gpu), workload=workload)
        out.append(math.log(_metric(case, evaluate(ctx, case.strategy)) / case.value))
    return out


def _median_abs(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors)


def fit(cases, grid_s=None, reread: float = 0.0) -> tuple[float, dict[float, float]]:
    """The overhead with the lowest median |log error| at ``reread``, and the whole curve."""
    grid_s = OVERHEAD_GRID_S if grid_s is None else grid_s
    curve = {float(g): _median_abs(_errors(cases, float(g), reread)) for g in grid_s}
    return min(curve, key=curve.get), curve


def fit_reread(cases, overhead_s: float, grid=None) -> tuple[float, dict[float, float]]:
    """The masked-MHA re-read fraction with the lowest median |log error| on the rows it touches."""
    grid = REREAD_GRID if grid is None else grid
    mmha = [(c, r) for c, r in cases if _touched(c, r)]
    if not mmha:
        return inference.MMHA_KV_REREAD, {}
    curve = {float(g): _median_abs(_errors(mmha, overhead_s, float(g))) for g in grid}
    return min(curve, key=curve.get), curve


def _touched(case, row) -> bool:
    """Whether the row's runtime decodes with the masked-MHA kernel (a static or decode row)."""
    return case.ctx.workload.phase != "prefill" and decode_kv_reread(row, case.ctx.model, 1.0) > 0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="+", default=[DEFAULT_DATA])
    args = parser.parse_args(argv)
    for path in args.data:
        if not path.is_file():
            raise SystemExit(f"error: --data: no such file {path}")
    cases, skipped = _cases(args.data)
    if not cases:
        raise SystemExit(f"error: --data: no usable rows in {', '.join(map(str, args.data))}")
    # The re-read at the catalog's overhead (the value the study runs with), then the overhead the fit
    # rows prefer at that re-read: the overhead's curve is flat (a few points over 0-6 ms), so fitting
    # both jointly would let its noise move the re-read.
    catalog_s = cases[0][0].ctx.cluster.gpu.iteration_overhead_s
    reread, reread_curve = fit_reread(cases, catalog_s)
    overhead, curve = fit(cases, reread=reread)
    for g, err in curve.items():
        print(f"iteration_overhead {g * 1e3:5.2f} ms: median |error| {math.expm1(err):6.1%}"
              + ("   <- best" if g == overhead else ""))
    for g, err in reread_curve.items():
        print(f"mmha kv reread {g:4.2f}: median |error| {math.expm1(err):6.1%} (masked-MHA rows)"
              + ("   <- best" if g == reread else ""))
    errors = _errors(cases, overhead, reread)
    figures = {"split": "fit", "iteration_overhead_s": overhead, "catalog_iteration_overhead_s": catalog_s,
               "mmha_kv_reread": reread,
               "rows_used": len(cases), "rows_skipped": skipped,
               "mmha_rows": sum(_touched(c, r) for c, r in cases),
               "median_abs_rel_error": math.expm1(_median_abs(errors))}
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
