"""Fit DeepEP's few physical constants on the fit rows of ``ep_alltoall_deepep.csv``.

``python -m validation.studies.moe.fit [--data CSV]`` fits, by least squares on log(predicted /
measured) over the rows of :data:`validation.studies.moe.rows.FIT_SOURCES` (the initial DeepEP README:
normal kernels within a node and across 2-8 nodes, pure-RDMA low-latency kernels at EP 8-256, all
on H800), the NVLink and RDMA efficiencies of the normal kernels and the RDMA efficiency, fixed cost
and per-peer cost of the low-latency kernels; prints them beside the catalog's
(:data:`simcore.moe.deepep.DEFAULT_DEEPEP`, which holds the rounded fit) and the test rows' errors
under the fit. Efficiencies are fractions of the GPU catalog's link rates, so the H800 fit carries
over to H100 (NVLink 450 GB/s per direction against H800's 200; the same 400 Gb/s NIC).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simcore.files import dumps
from simcore.moe.deepep import DEFAULT_DEEPEP, DeepEPConstants
from validation.studies.moe.model import error, evaluate
from validation.studies.moe.rows import MoeCase, load_cases

__all__ = ["FITTED", "fit", "main"]

#: fitted fields, their scale in the optimizer (seconds as microseconds) and bounds
FITTED = {"nvlink_efficiency": (1.0, 0.2, 1.0), "rdma_efficiency": (1.0, 0.2, 1.0),
          "ll_rdma_efficiency": (1.0, 0.2, 1.0), "ll_latency_s": (1e-6, 0.0, 50.0),
          "ll_per_peer_s": (1e-6, 0.0, 2.0)}
_DATA = Path(__file__).resolve().parents[2] / "data" / "ep_alltoall_deepep.csv"


def _constants(x: np.ndarray, base: DeepEPConstants) -> DeepEPConstants:
    return dataclasses.replace(base, **{k: float(v) * FITTED[k][0] for k, v in zip(FITTED, x, strict=True)})


def fit(cases: list[MoeCase], base: DeepEPConstants = DEFAULT_DEEPEP) -> DeepEPConstants:
    """Constants minimizing the squared log error over ``cases`` (the other fields stay ``base``'s)."""
    if not cases:
        raise ValueError("no fit rows")
    x0 = np.array([getattr(base, k) / FITTED[k][0] for k in FITTED])
    lo, hi = np.array([b[1] for b in FITTED.values()]), np.array([b[2] for b in FITTED.values()])

    def residuals(x):
        c = _constants(x, base)
        return np.array([np.log1p(error(case, c)[1]) for case in cases])

    result = least_squares(residuals, np.clip(x0, lo, hi), bounds=(lo, hi))
    return _constants(result.x, base)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(_DATA))
    args = parser.parse_args(argv)
    cases, skipped = load_cases(args.data)
    fitted = fit([c for c in cases if c.split == "fit"])
    for name, (scale, _, _) in FITTED.items():
        unit = " us" if scale == 1e-6 else ""
        print(f"{name:20} fitted {getattr(fitted, name) / scale:8.4f}{unit}   catalog "
              f"{getattr(DEFAULT_DEEPEP, name) / scale:8.4f}{unit}")
    _, summary = evaluate(cases, fitted)
    for split, s in summary["by_split"].items():
        print(f"{split} rows under the fit: {s['rows']}, median |error| {s['median_abs_error']:.1%}, "
              f"max {s['max_abs_error']:.1%}")
    out = {"fitted": {k: getattr(fitted, k) for k in FITTED}, "rows_skipped": len(skipped),
           "fit": summary["by_split"].get("fit"), "test": summary["by_split"].get("test")}
    print(dumps(out))
    return out


if __name__ == "__main__":
    main()
