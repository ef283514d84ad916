"""Predict forward passes timed without a serving runtime (CUDA graphs), e.g. our own H100 runs.

``python -m validation.studies.inference.compare_measured [--data PATH ...] [--runtime-overhead-s S] [--no-sim]``

Reads rows in the schema of ``inference_calibration.csv`` (default: ``inference_h100_measured.csv``,
written by ``validation.studies.inference.measure_decode``) and predicts each with the simulator and the proxy. The one
difference from the inference study is physical, not per row: those rows carry no scheduler or Python
cost between forward passes, so the catalog GPU's ``iteration_overhead_s`` (the serving runtime's cost
per pass, fitted on vLLM/TensorRT-LLM figures) is replaced by ``--runtime-overhead-s`` (default 0).
Everything else (kernels, launch overhead per kernel, attention, HBM) is the calibrated model as is, so
this scores the compute model out of sample (the shipped rows are ``split=test``; ``by_split`` labels
the figure with its set and row count). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
from pathlib import Path

from simcore.cost.lowering import CostContext
from simcore.files import dumps
from validation.studies.common.cli import BadInput, run_script
from validation.studies.common.split import split_label, split_of
from validation.studies.inference import parse_row, predict

__all__ = ["main"]

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "data" / "inference_h100_measured.csv"


def _without_runtime(case, overhead_s: float):
    cluster = case.ctx.cluster
    gpu = cluster.gpu.with_overrides(iteration_overhead_s=overhead_s)
    ctx = CostContext(case.ctx.model, case.ctx.workload, dataclasses.replace(cluster, gpu=gpu),
                      case.ctx.collective_constants)
    return dataclasses.replace(case, ctx=ctx)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="+", default=[DEFAULT_DATA])
    parser.add_argument("--runtime-overhead-s", type=float, default=0.0,
                        help="host cost per forward pass the measurements carry (0: CUDA graphs)")
    parser.add_argument("--no-sim", action="store_true", help="proxy only")
    args = parser.parse_args(argv)
    if not args.runtime_overhead_s >= 0:
        raise BadInput("error: --runtime-overhead-s must be >= 0")
    errors: dict[str, list[float]] = {"sim": [], "proxy": []}
    by_phase: dict[str, list[float]] = {}
    by_split: dict[str, list[float]] = {}
    skipped = 0
    print(f"{'model':<14} {'phase':<8} {'batch':>5} {'len':>5} {'metric':<8} {'meas':>9} {'sim':>9} "
          f"{'proxy':>9} {'err':>7}")
    for path in args.data:
        if not path.is_file():
            raise BadInput(f"error: --data: no such file {path}")
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                try:
                    split = split_of(row)
                    case = _without_runtime(parse_row(row), args.runtime_overhead_s)
                except (ValueError, KeyError) as err:
                    skipped += 1
                    print(f"skipped {row.get('model')} {row.get('scenario')}: {err}")
                    continue
                sim, proxy = predict(case, simulate_too=not args.no_sim)
                best = proxy if args.no_sim else sim
                err = best / case.value - 1.0
                errors["proxy"].append(abs(proxy / case.value - 1.0))
                if not args.no_sim:
                    errors["sim"].append(abs(err))
                by_phase.setdefault(row["scenario"], []).append(abs(err))
                by_split.setdefault(split, []).append(abs(err))
                print(f"{row['model']:<14} {row['scenario']:<8} {row['batch']:>5} {row['input_len']:>5} "
                      f"{case.metric:<8} {case.value:9.3f} {sim:9.3f} {proxy:9.3f} {err:+7.1%}")
    summary = {"data": [str(p) for p in args.data], "runtime_overhead_s": args.runtime_overhead_s,
               "rows": len(errors["proxy"]), "skipped": skipped,
               "median_abs_err": {k: round(statistics.median(v), 4) for k, v in errors.items() if v},
               "median_abs_err_by_phase": {k: round(statistics.median(v), 4) for k, v in by_phase.items()},
               "by_split": {split_label(k, len(v)): round(statistics.median(v), 4) for k, v in by_split.items()}}
    print(dumps(summary))
    return summary


if __name__ == "__main__":
    run_script(main)
