"""Fit the runtime parameters the kernel and collective fits cannot see, on fit rows only.

``python -m validation.studies.inference.fit [--data PATH ...]``

* ``GpuSpec.iteration_overhead_s``: the host's time per step (scheduling, sampling, input
  preparation), charged once per step (a prefill pass, a decode step of every microbatch) beside the
  GPU's (:mod:`simcore.cost.host`), on every usable row;
* ``NcclConstants.launch_overhead_s``: what the runtime adds to each collective beyond NCCL's own
  latency, fitted jointly with the host time. The collectives fit cannot see it: every row there is
  charged the per-call cost of the harness that measured it (nccl-tests, XLA, torch.distributed;
  :mod:`validation.studies.collectives.harness`), and none of them is a serving runtime; searched within the
  harnesses' range (``LAUNCH_GRID_S``);
* ``MMHA_KV_REREAD`` (``validation.studies.inference``, a ``Workload.decode_kv_reread``): the fraction
  of a KV head each further query head of its group re-reads from HBM under TensorRT-LLM's masked-MHA
  decode kernel (before XQA), on the rows that run it.

Each is the grid value with the lowest median |log(predicted / measured)| of the proxy: the re-read
at the catalog's values, then the host time and the collective launch cost jointly at that re-read.
Three scalars for all rows, never per-row factors. The rows are TensorRT-LLM's C++ benchmarks, eager
launches (``Workload.cuda_graphs`` false) and a synchronous step loop (``host_overlap`` false). The data must be
fit rows (``validation/studies/common/split.py``): a test row is a one-line error. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import statistics
from pathlib import Path

import numpy as np

from simcore.collectives import DEFAULT
from simcore.cost.proxy import evaluate
from simcore.files import dumps
from validation.studies import inference
from validation.studies.collectives.harness import HARNESS_OVERHEAD_S
from validation.studies.common.cli import BadInput, run_script
from validation.studies.common.split import refuse_test_rows
from validation.studies.inference import _metric, decode_kv_reread, parse_row

__all__ = ["main", "fit", "fit_reread"]

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "data" / "inference_calibration.csv"
OVERHEAD_GRID_S = np.arange(0.0, 6.01e-3, 0.25e-3)
#: The collective launch cost is a runtime's per-call cost, the kind of thing each measuring harness adds
#: (validation.studies.collectives.harness): searched between nccl-tests' 0 and the costliest harness measured,
#: eager torch.distributed (Python + c10d per call); a C++ runtime should cost no more than that.
LAUNCH_GRID_S = np.append(np.arange(0.0, HARNESS_OVERHEAD_S["torch"], 1.5e-6), HARNESS_OVERHEAD_S["torch"])
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


def _errors(cases, overhead_s: float, reread: float, launch_s: float | None = None) -> list[float]:
    """log(pred / meas) of every case with these parameters (``launch_s`` None: the catalog's)."""
    out = []
    for case, row in cases:
        gpu = case.ctx.cluster.gpu.with_overrides(iteration_overhead_s=overhead_s)
        # the row's runtime generation decides whether the re-read applies
        workload = dataclasses.replace(case.ctx.workload, decode_kv_reread=decode_kv_reread(row, case.ctx.model, reread))
        constants = case.ctx.collective_constants or DEFAULT
        if launch_s is not None:
            constants = constants.with_overrides(launch_overhead_s=launch_s)
        ctx = dataclasses.replace(case.ctx, cluster=dataclasses.replace(case.ctx.cluster, gpu=gpu), workload=workload,
                                  collective_constants=constants)
        out.append(math.log(_metric(case, evaluate(ctx, case.strategy)) / case.value))
    return out


def _median_abs(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors)


def fit(cases, grid_s=None, reread: float = 0.0, launch_grid_s=None) -> tuple[tuple[float, float], dict]:
    """The (host time per step, collective launch cost) with the lowest median |log error| at
    ``reread``, and the whole surface ``{(host, launch): error}``."""
    grid_s = OVERHEAD_GRID_S if grid_s is None else grid_s
    launch_grid_s = LAUNCH_GRID_S if launch_grid_s is None else launch_grid_s
    surface = {(float(g), float(c)): _median_abs(_errors(cases, float(g), reread, float(c)))
               for c in launch_grid_s for g in grid_s}
    return min(surface, key=surface.get), surface


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
            raise BadInput(f"error: --data: no such file {path}")
    cases, skipped = _cases(args.data)
    if not cases:
        raise BadInput(f"error: --data: no usable rows in {', '.join(map(str, args.data))}")
    # The re-read at the catalog's values (those the study runs with), then the host time and the launch
    # cost the fit rows prefer at that re-read: their surface is flat, so fitting all three jointly
    # would let its noise move the re-read.
    catalog_s = cases[0][0].ctx.cluster.gpu.iteration_overhead_s
    catalog_launch_s = (cases[0][0].ctx.collective_constants or DEFAULT).launch_overhead_s
    reread, reread_curve = fit_reread(cases, catalog_s)
    (overhead, launch), surface = fit(cases, reread=reread)
    for g in sorted({g for g, _ in surface}):
        err = surface[(g, launch)]
        print(f"host per step {g * 1e3:5.2f} ms (launch {launch * 1e6:4.1f} us): median |error| "
              f"{math.expm1(err):6.1%}" + ("   <- best" if g == overhead else ""))
    for c in sorted({c for _, c in surface}):
        g, err = min(((g, e) for (g, cc), e in surface.items() if cc == c), key=lambda x: x[1])
        print(f"collective launch {c * 1e6:4.1f} us: best host {g * 1e3:4.2f} ms, median |error| "
              f"{math.expm1(err):6.1%}" + ("   <- best" if c == launch else ""))
    for g, err in reread_curve.items():
        print(f"mmha kv reread {g:4.2f}: median |error| {math.expm1(err):6.1%} (masked-MHA rows)"
              + ("   <- best" if g == reread else ""))
    errors = _errors(cases, overhead, reread, launch)
    figures = {"split": "fit", "iteration_overhead_s": overhead, "catalog_iteration_overhead_s": catalog_s,
               "launch_overhead_s": launch, "catalog_launch_overhead_s": catalog_launch_s,
               "mmha_kv_reread": reread,
               "rows_used": len(cases), "rows_skipped": skipped,
               "mmha_rows": sum(_touched(c, r) for c, r in cases),
               "median_abs_rel_error": math.expm1(_median_abs(errors))}
    print(dumps(figures))
    return figures


if __name__ == "__main__":
    run_script(main)
