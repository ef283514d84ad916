"""Fit the few physical parameters of the collective model on published measurements.

Least squares on log time over the usable rows of a CSV in the collectives_calibration schema
(:mod:`validation.studies.collectives` parses it), in two stages so each parameter is identified by the
rows it governs:

1. bandwidth parameters on bandwidth-bound rows (size >= 1 GiB, where latency is < 1 % of the time):
   the achievable NVLink fraction ``nvlink_efficiency`` and the un-overlapped ring fill steps of copy
   and reduce passes (``ring_fill_steps_copy`` / ``ring_fill_steps_reduce``);
2. latency parameters on every row: the per-collective ``launch_overhead_s``.

NCCL's own constants stay as NCCL has them; no per-row factors. The printed values are the
``NcclConstants`` defaults (``simcore/collectives/constants.py``).

Run: ``python -m validation.fit_collectives [--data PATH]``; the last line of output is JSON.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
from scipy.optimize import least_squares

from simcore.collectives import DEFAULT, Fabric, NcclConstants, collective_time_s
from simcore.hardware import get_gpu
from validation.studies.collectives import DEFAULT_DATA, Case, load_rows, parse_row

__all__ = ["FIT_PARAMS", "BANDWIDTH_PARAMS", "LATENCY_PARAMS", "load_cases", "log_residuals", "fit",
           "fit_staged", "main"]

#: name -> (lower bound, upper bound, scale of the optimizer's variable).
FIT_PARAMS: dict[str, tuple[float, float, float]] = {
    "nvlink_efficiency": (0.5, 1.0, 1.0),
    "launch_overhead_s": (0.0, 50e-6, 1e-6),
    "ring_fill_steps_copy": (0.0, 3.0, 1.0),
    "ring_fill_steps_reduce": (0.0, 3.0, 1.0),
}
BANDWIDTH_PARAMS = ("nvlink_efficiency", "ring_fill_steps_copy", "ring_fill_steps_reduce")
LATENCY_PARAMS = ("launch_overhead_s",)
BANDWIDTH_MIN_BYTES = 2.0**30
_FABRIC = Fabric.from_gpu(get_gpu("h100-sxm"), nvlink_domain_size=8)


def load_cases(path) -> list[Case]:
    """Every parseable row of the CSV (bad rows are skipped, as the study does)."""
    cases = []
    for row in load_rows(path):
        try:
            cases.append(parse_row(row))
        except ValueError:
            continue
    return cases


def _batches(cases: list[Case]) -> list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Cases grouped by (collective, algorithm) as arrays, so each evaluation is a few vector calls."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        groups[(c.collective, c.algorithm)].append(i)
    out = []
    for (coll, algo), idx in groups.items():
        sel = [cases[i] for i in idx]
        out.append((coll, algo, np.array(idx), np.array([c.size_bytes for c in sel]),
                    np.array([c.n_ranks for c in sel]), np.array([c.gpus_per_node for c in sel])))
    return out


def log_residuals(cases: list[Case], constants: NcclConstants, batches=None) -> np.ndarray:
    """log(simulated / measured) per case."""
    batches = batches or _batches(cases)
    sim = np.empty(len(cases))
    for coll, algo, idx, size, n, p in batches:
        sim[idx] = collective_time_s(coll, size, n, p, _FABRIC, algorithm=algo, constants=constants)
    return np.log(sim / np.array([c.measured_time_s for c in cases]))


def fit(cases: list[Case], params: tuple[str, ...] = tuple(FIT_PARAMS),
        start: NcclConstants = DEFAULT) -> tuple[NcclConstants, np.ndarray]:
    """Least-squares fit of ``params`` on log time; returns (fitted constants, final residuals)."""
    batches = _batches(cases)
    scale = np.array([FIT_PARAMS[p][2] for p in params])
    lower = np.array([FIT_PARAMS[p][0] for p in params]) / scale
    upper = np.array([FIT_PARAMS[p][1] for p in params]) / scale
    x0 = np.clip(np.array([getattr(start, p) for p in params]) / scale, lower, upper)

    def constants_of(x: np.ndarray) -> NcclConstants:
        return start.with_overrides(**{p: float(v) for p, v in zip(params, x * scale, strict=True)})

    result = least_squares(lambda x: log_residuals(cases, constants_of(x), batches), x0,
                           bounds=(lower, upper), diff_step=1e-3)
    best = constants_of(result.x)
    return best, log_residuals(cases, best, batches)


def fit_staged(cases: list[Case], min_bytes: float = BANDWIDTH_MIN_BYTES,
               start: NcclConstants = DEFAULT) -> tuple[NcclConstants, np.ndarray]:
    """Bandwidth parameters on rows of at least ``min_bytes``, then latency parameters on all rows."""
    big = [c for c in cases if c.size_bytes >= min_bytes]
    if not big:
        raise ValueError(f"no row of at least {min_bytes:.0f} bytes to fit the bandwidth parameters on")
    stage1, _ = fit(big, BANDWIDTH_PARAMS, start)
    return fit(cases, LATENCY_PARAMS, stage1)


def _band_errors(cases: list[Case], residuals: np.ndarray) -> dict[str, float]:
    err = np.maximum(np.abs(np.expm1(residuals)), 1e-6)
    big = np.array([c.size_bytes >= 2**20 for c in cases])

    def geomean(mask: np.ndarray) -> float | None:
        return float(np.exp(np.log(err[mask]).mean())) if mask.any() else None

    return {"geomean_abs_rel_error": geomean(np.ones_like(big)),
            "geomean_abs_rel_error_lt_1MiB": geomean(~big), "geomean_abs_rel_error_ge_1MiB": geomean(big)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--bandwidth-min-bytes", type=float, default=BANDWIDTH_MIN_BYTES,
                        help="rows at least this large fit the bandwidth parameters")
    args = parser.parse_args(argv)
    params = BANDWIDTH_PARAMS + LATENCY_PARAMS
    cases = load_cases(args.data)
    before = _band_errors(cases, log_residuals(cases, DEFAULT))
    best, residuals = fit_staged(cases, args.bandwidth_min_bytes)
    after = _band_errors(cases, residuals)
    n_bw = sum(c.size_bytes >= args.bandwidth_min_bytes for c in cases)
    print(f"rows used: {len(cases)} ({n_bw} for the bandwidth stage)")
    for p in params:
        print(f"  {p:24s} = {getattr(best, p):.6g}   (default {getattr(DEFAULT, p):.6g})")
    for k in after:
        print(f"  {k:34s} defaults {before[k]:.3f} -> fitted {after[k]:.3f}")
    figures = {"rows": len(cases), "fitted": {p: getattr(best, p) for p in params}, "before": before,
               "after": after, "rms_log_residual": float(np.sqrt(np.mean(residuals**2)))}
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
