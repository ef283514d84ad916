"""Fit each serving runtime's host time per step on the fit set of the measured serving runs.

``python -m validation.fit_serving [--data CSV] [--rows N]``: for each backend (vLLM, SGLang,
TensorRT-LLM), the one physical parameter ``RuntimeProfile.step_host_s`` (scheduling, input preparation,
sampling and detokenization per step that no kernel covers) is chosen on a grid to minimise the median
of ``|log(simulated / measured)|`` over the mean TTFT and TPOT of that backend's fit-set rows (the models
of :data:`validation.studies.serving.FIT_MODELS`; at most ``--rows`` of them, spread evenly). Test-set
rows are refused: the fit never sees them. Prints the chosen values (copy them into
``simcore/serving/runtime.py``) and ends with one JSON line.
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

GRID_S = (0.0, 0.5e-3, 1e-3, 2e-3, 3e-3, 4e-3, 6e-3, 8e-3)
_DATA = Path(__file__).resolve().parent / "data" / "serving_h200_measured.csv"


def _score(cases, runtime) -> float:
    errs = []
    for case in cases:
        ttft, tpot, why = simulate_case(case, runtime)
        if why:
            continue
        errs += [abs(math.log(ttft * 1e3 / float(case.row["silicon_ttft_ms"]))),
                 abs(math.log(tpot * 1e3 / float(case.row["silicon_tpot_ms"])))]
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
    for backend in ("vllm", "sglang", "trtllm"):
        mine = [c for c in fit if c.runtime == backend and c.plan.mode == "agg" and c.concurrency <= 256]
        if not mine:
            print(f"{backend}: no fit rows")
            continue
        step = max(len(mine) // args.rows, 1)
        mine = mine[::step][: args.rows]
        base = get_runtime(backend)
        scores = {h: _score(mine, base.with_overrides(step_host_s=h)) for h in GRID_S}
        best = min(scores, key=scores.get)
        fitted[backend] = {"step_host_s": best, "median_abs_log_error": scores[best], "rows": len(mine)}
        print(f"{backend:7s} rows {len(mine):3d}  " + "  ".join(f"{h * 1e3:.1f}ms:{s:.3f}" for h, s in scores.items())
              + f"  -> step_host_s = {best * 1e3:.1f} ms")
    print(json.dumps(fitted))
    return fitted


if __name__ == "__main__":
    main()
