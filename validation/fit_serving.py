"""Fit each serving runtime's host time per step on the fit set of the measured serving runs.

``python -m validation.fit_serving [--data CSV] [--rows N]``: for each runtime profile (vLLM sync and
overlapped, SGLang, TensorRT-LLM; a profile with no fit rows is left as it is), three physical
parameters: its host time per step (``RuntimeProfile.step_host_s``,
fixed: scheduling and launch bookkeeping; ``step_host_per_seq_s``, per running sequence: its inputs,
sampling bookkeeping, detokenizing and streaming) and its small all-reduce kernel's fixed latency
(``custom_ar_s``), are chosen on grids, one after the other twice (coordinate descent), to minimise the median of ``|log(simulated / measured)|`` of the mean TPOT
of that backend's fit-set rows (the host time per step sets TPOT; TTFT is mostly queueing) (the models of :data:`validation.studies.serving.FIT_MODELS`; at most
``--rows`` of them, spread evenly). Test-set rows are refused: the fit never sees them. Prints the chosen
values (copy them into ``simcore/serving/runtime.py``) and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from simcore.serving import get_runtime
from validation.studies.serving import load_cases, simulate_case, split_of

__all__ = ["main", "GRID_S"]

GRID_S = (0.0, 1e-3, 2e-3, 4e-3, 6e-3, 9e-3, 12e-3)
GRID_PER_SEQ_S = (0.0, 10e-6, 20e-6, 40e-6, 60e-6, 90e-6)
GRID_CUSTOM_AR_S = (3e-6, 6e-6, 9e-6, 14e-6, 20e-6)
_DATA = Path(__file__).resolve().parent / "data" / "serving_h200_measured.csv"


def _score(cases, runtime) -> float:
    errs = []
    for case in cases:
        ttft, tpot, why = simulate_case(case, runtime)
        if why:
            continue
        errs.append(abs(math.log(tpot * 1e3 / float(case.row["silicon_tpot_ms"]))))
    return float(np.median(errs)) if errs else math.inf


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--rows", type=int, default=24, help="fit rows per backend (spread evenly)")
    args = parser.parse_args(argv)
    cases = [c for c in load_cases(args.data) if not c.skip]
    test = [c for c in cases if split_of(c.row) != "fit"]
    fit = [c for c in cases if split_of(c.row) == "fit"]
    print(f"{len(fit)} fit rows used, {len(test)} test rows refused (never simulated here)")
    fitted = {}
    for backend in ("vllm-sync", "vllm", "sglang", "trtllm"):
        mine = [c for c in fit if c.runtime == backend and c.plan.mode == "agg" and c.concurrency <= 512]
        if not mine:
            print(f"{backend}: no fit rows")
            continue
        step = max(len(mine) // args.rows, 1)
        mine = mine[::step][: args.rows]
        rt = get_runtime(backend)
        score = math.inf
        for _ in range(2):
            for field, grid in (("step_host_s", GRID_S), ("step_host_per_seq_s", GRID_PER_SEQ_S),
                                ("custom_ar_s", GRID_CUSTOM_AR_S)):
                scores = {v: _score(mine, rt.with_overrides(**{field: v})) for v in grid}
                best = min(scores, key=scores.get)
                rt, score = rt.with_overrides(**{field: best}), scores[best]
                print(f"{backend:7s} {field:20s} " + "  ".join(f"{v * 1e3:g}ms:{e:.3f}" for v, e in scores.items()),
                      flush=True)
        fitted[backend] = {"step_host_s": rt.step_host_s, "step_host_per_seq_s": rt.step_host_per_seq_s,
                           "custom_ar_s": rt.custom_ar_s,
                           "median_abs_log_error": score, "rows": len(mine)}
        print(f"{backend}: step_host_s = {rt.step_host_s * 1e3:g} ms, step_host_per_seq_s = "
              f"{rt.step_host_per_seq_s * 1e6:g} us ({len(mine)} rows, median |log error| {score:.3f})")
    print(json.dumps(fitted))
    return fitted


if __name__ == "__main__":
    main()
