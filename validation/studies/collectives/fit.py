"""Fit the few physical parameters of the collective model on published measurements.

Least squares on log time over the usable rows of a CSV in the collectives_calibration schema
(:mod:`validation.studies.collectives` parses it), in two stages so each parameter is identified by the
rows it governs:

1. bandwidth parameters on bandwidth-bound rows (size >= 1 GiB, where latency is < 1 % of the time):
   the achievable NVLink fraction ``nvlink_efficiency`` and the un-overlapped ring fill steps of copy
   and reduce passes (``ring_fill_steps_copy`` / ``ring_fill_steps_reduce``);
   then, on rows >= 1 MiB, the bytes of an NVLS all-reduce that do not overlap its reduce and multicast
   phases (``nvls_fill_bytes``: the fill that makes mid-size NVLS slower than latency + S / bandwidth);
2. on the rows below 1 MiB, the per-call overhead of each measuring harness (a base per harness with
   at least ``MIN_LATENCY_ROWS`` such rows, the others keep their prior, plus a per-device launch cost
   shared by all; :mod:`validation.studies.collectives.harness`). The simulator's own ``launch_overhead_s`` (what
   a serving framework pays per collective) is not fitted here; see ``NcclConstants``.
3. per scale-out fabric (``ib``, ``efa``, ``roce``; :func:`validation.studies.collectives.fabric_of`), on
   the multi-node rows only: the NIC efficiency and the network pipeline fill (``net_fill_bytes``) on
   rows >= 1 MiB, the per-hop network latency (NCCL's ``latencyInter``) on nccl-tests rows below 1 MiB;
   a parameter without such rows keeps its prior. Stages 1-2 use single-node rows only, so multi-node rows never move the NVLink terms.

Only fit rows are used: a CSV holding test rows (``split=test``, or a source of a shipped test file;
:mod:`validation.studies.common.split`) is refused with a one-line error.

NCCL's own constants stay as NCCL has them; no per-row factors. The printed values are the
``NcclConstants`` defaults (``simcore/collectives/constants.py``) and ``HARNESS_OVERHEAD_S``.

Run: ``python -m validation.studies.collectives.fit [--data PATH]``; the last line of output is JSON.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
from scipy.optimize import least_squares

from simcore.collectives import DEFAULT, Fabric, NcclConstants, collective_time_s
from simcore.collectives.constants import FABRICS
from simcore.files import dumps
from simcore.hardware.gpus import get_gpu
from validation.studies.collectives import DEFAULT_DATA, Case, load_rows, parse_row
from validation.studies.collectives.harness import HARNESS_OVERHEAD_S, PER_DEVICE_LAUNCH_S
from validation.studies.common.cli import run_script
from validation.studies.common.split import refuse_test_rows

__all__ = ["FIT_PARAMS", "BANDWIDTH_PARAMS", "PIPELINE_PARAMS", "load_cases", "log_residuals", "fit",
           "fit_overheads", "fit_staged", "fit_fabrics", "fabric_params", "main"]

#: name -> (lower bound, upper bound, scale of the optimizer's variable).
FIT_PARAMS: dict[str, tuple[float, float, float]] = {
    "nvlink_efficiency": (0.5, 1.0, 1.0),
    "launch_overhead_s": (0.0, 50e-6, 1e-6),  # bounds of every per-call overhead (harness bases too)
    "ring_fill_steps_copy": (0.0, 3.0, 1.0),
    "ring_fill_steps_reduce": (0.0, 3.0, 1.0),
    "nvls_fill_bytes": (0.0, 64e6, 1e6),
    **{f"{p}nic_efficiency": (0.3, 1.0, 1.0) for p in ("", "efa_", "roce_")},
    **{f"{p}net_latency_s": (0.0, 200e-6, 1e-6) for p in ("", "efa_", "roce_")},
    **{f"{p}net_fill_bytes": (0.0, 256e6, 1e6) for p in ("", "efa_", "roce_")},
}
BANDWIDTH_PARAMS = ("nvlink_efficiency", "ring_fill_steps_copy", "ring_fill_steps_reduce")
PIPELINE_PARAMS = ("nvls_fill_bytes",)
PIPELINE_MIN_BYTES = 2.0**20
BANDWIDTH_MIN_BYTES = 2.0**30
MIN_LATENCY_ROWS = 3  # rows below 1 MiB a harness needs before its overhead is fitted
_FABRICS = {f: Fabric.from_gpu(get_gpu("h100-sxm"), nvlink_domain_size=8, scale_out=f) for f in FABRICS}


def fabric_params(fabric: str) -> tuple[str, str, str]:
    """(NIC efficiency, network latency, network fill) fields of ``fabric`` in ``NcclConstants``."""
    prefix = "" if fabric == "ib" else f"{fabric}_"
    return f"{prefix}nic_efficiency", f"{prefix}net_latency_s", f"{prefix}net_fill_bytes"


def load_cases(path) -> list[Case]:
    """Every parseable row of the CSV (bad rows are skipped, as the study does); a file with test rows is
    refused (``SystemExit`` with a one-line error)."""
    rows = load_rows(path)
    refuse_test_rows(rows, path)
    cases = []
    for row in rows:
        try:
            cases.append(parse_row(row))
        except ValueError:
            continue
    return cases


def _batches(cases: list[Case]) -> list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Cases grouped by (collective, algorithm) as arrays, so each evaluation is a few vector calls."""
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        groups[(c.collective, c.algorithm, c.fabric)].append(i)
    out = []
    for (coll, algo, fabric), idx in groups.items():
        sel = [cases[i] for i in idx]
        out.append((coll, algo, fabric, np.array(idx), np.array([c.size_bytes for c in sel]),
                    np.array([c.n_ranks for c in sel]), np.array([c.gpus_per_node for c in sel])))
    return out


def _simulated(cases: list[Case], constants: NcclConstants, batches) -> np.ndarray:
    """Simulated seconds per case without any per-call overhead."""
    constants = constants.with_overrides(launch_overhead_s=0.0)
    sim = np.empty(len(cases))
    for coll, algo, fabric, idx, size, n, p in batches:
        sim[idx] = collective_time_s(coll, size, n, p, _FABRICS[fabric], algorithm=algo, constants=constants)
    return sim


def _devices(cases: list[Case]) -> np.ndarray:
    return np.array([c.devices_per_process - 1.0 for c in cases])


def log_residuals(cases: list[Case], constants: NcclConstants, batches=None,
                  overheads: dict[str, float] = HARNESS_OVERHEAD_S,
                  per_device_s: float = PER_DEVICE_LAUNCH_S) -> np.ndarray:
    """log(simulated / measured) per case, each charged its harness's overhead as the study does."""
    sim = _simulated(cases, constants, batches or _batches(cases))
    sim += np.array([overheads[c.harness] for c in cases]) + per_device_s * _devices(cases)
    return np.log(sim / np.array([c.measured_time_s for c in cases]))


def _robust_fit(residuals, x0: list[float], high: float):
    """Robust (soft-L1 on log time) least squares in microseconds: the published small-message tables
    have warm-up outliers (the XLA table's first size is 2-10x its neighbours) that plain least
    squares would chase."""
    result = least_squares(residuals, x0, bounds=([0.0] * len(x0), [high / 1e-6] * len(x0)),
                           loss="soft_l1", f_scale=0.1)
    return result.x * 1e-6


def fit_overheads(cases: list[Case], constants: NcclConstants, prior: dict[str, float] = HARNESS_OVERHEAD_S,
                  ) -> tuple[dict[str, float], float]:
    """(base overhead per harness, per-device launch seconds).

    Fitted together on the rows below 1 MiB, where the overhead is most of the time and the bandwidth
    model's errors do not leak in. A harness with fewer than ``MIN_LATENCY_ROWS`` such rows keeps its
    ``prior`` base; the per-device term needs rows whose process drove more than one GPU, else it keeps
    ``PER_DEVICE_LAUNCH_S``."""
    small = [c for c in cases if c.size_bytes < 2**20]
    base = _simulated(small, constants, _batches(small)) if small else np.zeros(0)
    measured = np.array([c.measured_time_s for c in small])
    harness = np.array([c.harness for c in small])
    devices = _devices(small)
    fitted = [h for h in sorted(set(harness)) if (harness == h).sum() >= MIN_LATENCY_ROWS]
    free_device = bool(fitted) and bool((devices[np.isin(harness, fitted)] > 0).any())
    overheads, per_device = dict(prior), PER_DEVICE_LAUNCH_S
    if fitted:
        rows = np.isin(harness, fitted)
        index = np.array([fitted.index(h) if h in fitted else 0 for h in harness])[rows]

        def residuals(x):
            dev = x[-1] if free_device else per_device / 1e-6
            return np.log((base[rows] + (x[index] + dev * devices[rows]) * 1e-6) / measured[rows])

        x = _robust_fit(residuals, [10.0] * len(fitted) + ([2.0] if free_device else []),
                        FIT_PARAMS["launch_overhead_s"][1])
        overheads.update(zip(fitted, map(float, x[:len(fitted)]), strict=True))
        per_device = float(x[-1]) if free_device else per_device
    return overheads, per_device


def fit(cases: list[Case], params: tuple[str, ...] = BANDWIDTH_PARAMS, start: NcclConstants = DEFAULT,
        overheads: dict[str, float] = HARNESS_OVERHEAD_S,
        per_device_s: float = PER_DEVICE_LAUNCH_S, loss: str = "linear") -> tuple[NcclConstants, np.ndarray]:
    """Least-squares fit of ``NcclConstants`` fields ``params`` on log time, each row charged its
    harness's overhead from ``overheads``; returns (fitted constants, final residuals). ``loss="soft_l1"``
    is robust to warm-up outliers (the first size of a published sweep is often 2-4x its neighbours)."""
    batches = _batches(cases)
    scale = np.array([FIT_PARAMS[p][2] for p in params])
    lower = np.array([FIT_PARAMS[p][0] for p in params]) / scale
    upper = np.array([FIT_PARAMS[p][1] for p in params]) / scale
    x0 = np.clip(np.array([getattr(start, p) for p in params]) / scale, lower, upper)
    x0 = np.where(x0 == 0.0, 0.1 * upper, x0)  # a finite-difference step from 0 is too small to move

    def constants_of(x: np.ndarray) -> NcclConstants:
        return start.with_overrides(**{p: float(v) for p, v in zip(params, x * scale, strict=True)})

    result = least_squares(lambda x: log_residuals(cases, constants_of(x), batches, overheads, per_device_s),
                           x0, bounds=(lower, upper), diff_step=1e-3, loss=loss, f_scale=0.1)
    best = constants_of(result.x)
    return best, log_residuals(cases, best, batches, overheads, per_device_s)


def fit_staged(cases: list[Case], min_bytes: float = BANDWIDTH_MIN_BYTES, start: NcclConstants = DEFAULT,
               ) -> tuple[NcclConstants, dict[str, float], float, np.ndarray]:
    """Bandwidth parameters on rows of at least ``min_bytes``, the NVLS fill on rows >= 1 MiB, then the
    overheads (:func:`fit_overheads`).

    Returns (fitted constants, base overhead per harness, per-device launch seconds, the study's log
    residuals at those values)."""
    single = [c for c in cases if c.nodes == 1]
    big = [c for c in single if c.size_bytes >= min_bytes]
    if not big:
        raise ValueError(f"no single-node row of at least {min_bytes:.0f} bytes to fit the bandwidth "
                         "parameters on")
    mid = [c for c in single if c.size_bytes >= PIPELINE_MIN_BYTES]
    overheads, per_device, stage1 = dict(HARNESS_OVERHEAD_S), PER_DEVICE_LAUNCH_S, start
    for _ in range(2):  # each stage barely touches the others' rows; a second round settles them
        stage1, _ = fit(big, BANDWIDTH_PARAMS, stage1, overheads, per_device)
        stage1, _ = fit(mid, PIPELINE_PARAMS, stage1, overheads, per_device)
        overheads, per_device = fit_overheads(single, stage1)
    stage1, _ = fit_fabrics(cases, stage1, overheads, per_device)
    return stage1, overheads, per_device, log_residuals(cases, stage1, None, overheads, per_device)


def fit_fabrics(cases: list[Case], start: NcclConstants, overheads: dict[str, float] = HARNESS_OVERHEAD_S,
                per_device_s: float = PER_DEVICE_LAUNCH_S) -> tuple[NcclConstants, dict[str, tuple[int, int]]]:
    """Per fabric, on its multi-node rows: the NIC efficiency and the network fill on rows >= 1 MiB
    (the efficiency is identified by the largest rows, the fill by the rise of busbw up to ~1 GiB), then
    the network latency on nccl-tests rows < 1 MiB; robust loss (a sweep's first size and a mid-size
    dip are often 2-4x off their neighbours). Returns (constants, {fabric: (rows for the bandwidth
    terms, rows for the latency)}); a parameter without rows keeps its prior."""
    used: dict[str, tuple[int, int]] = {}
    constants = start
    for fabric in FABRICS:
        eff, lat, fill = fabric_params(fabric)
        multi = [c for c in cases if c.nodes > 1 and c.fabric == fabric]
        big = [c for c in multi if c.size_bytes >= PIPELINE_MIN_BYTES]
        small = [c for c in multi if c.size_bytes < PIPELINE_MIN_BYTES and c.harness == "nccl-tests"]
        # one size per row set cannot tell the fill from the efficiency: then the fill keeps its prior.
        # RoCE runs NCCL's IB verbs transport on the same ConnectX-7 NICs as InfiniBand, so IB's fitted
        # latency and fill are its priors (EFA's libfabric/SRD transport is another matter)
        params = (eff, fill) if len({c.size_bytes for c in big}) >= 3 else (eff,)
        if fabric == "roce":
            constants = constants.with_overrides(**{
                name: getattr(constants, ib) for name, ib, ok in ((lat, "net_latency_s", small),
                                                                 (fill, "net_fill_bytes", fill in params))
                if not ok})
        for _ in range(2):  # the latency barely moves the big rows and vice versa; a second round settles
            if big:
                constants, _ = fit(big, params, constants, overheads, per_device_s, loss="soft_l1")
            if small:
                constants, _ = fit(small, (lat,), constants, overheads, per_device_s, loss="soft_l1")
        used[fabric] = (len(big), len(small))
    return constants, used


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
    params = BANDWIDTH_PARAMS + PIPELINE_PARAMS + tuple(p for f in FABRICS for p in fabric_params(f))
    cases = load_cases(args.data)
    before = _band_errors(cases, log_residuals(cases, DEFAULT))
    best, overheads, per_device, residuals = fit_staged(cases, args.bandwidth_min_bytes)
    after = _band_errors(cases, residuals)
    n_bw = sum(c.size_bytes >= args.bandwidth_min_bytes for c in cases)
    print(f"rows used: {len(cases)} (fit split; {n_bw} >= {args.bandwidth_min_bytes:.0f} B; "
          f"{sum(c.nodes > 1 for c in cases)} multi-node)")
    for fabric in FABRICS:
        multi = [c for c in cases if c.nodes > 1 and c.fabric == fabric]
        big = sum(c.size_bytes >= PIPELINE_MIN_BYTES for c in multi)
        small = sum(c.size_bytes < PIPELINE_MIN_BYTES and c.harness == "nccl-tests" for c in multi)
        print(f"  fabric {fabric:4s}: {len(multi)} multi-node rows ({big} >= 1 MiB for NIC efficiency and fill, "
              f"{small} nccl-tests < 1 MiB for the latency{'; prior kept where 0' if not (big and small) else ''})")
    for p in params:
        print(f"  {p:24s} = {getattr(best, p):.6g}   (default {getattr(DEFAULT, p):.6g})")
    counts = {h: (sum(c.harness == h for c in cases), sum(c.harness == h and c.size_bytes < 2**20 for c in cases))
              for h in overheads}
    for h, value in overheads.items():
        how = "fitted" if counts[h][1] >= MIN_LATENCY_ROWS else "prior, not fitted"
        print(f"  overhead[{h}]{'':{max(0, 14 - len(h))}s} = {value * 1e6:7.3f} us  (HARNESS_OVERHEAD_S "
              f"{HARNESS_OVERHEAD_S.get(h, float('nan')) * 1e6:.3f} us; {counts[h][0]} rows, {counts[h][1]} "
              f"< 1 MiB; {how})")
    print(f"  per-device launch        = {per_device * 1e6:7.3f} us  (PER_DEVICE_LAUNCH_S "
          f"{PER_DEVICE_LAUNCH_S * 1e6:.3f} us)")
    for k in after:
        print(f"  {k:34s} defaults {before[k]:.3f} -> fitted {after[k]:.3f}")
    figures = {"rows": len(cases), "fitted": {p: getattr(best, p) for p in params},
               "harness_overhead_s": overheads, "per_device_launch_s": per_device, "before": before, "after": after,
               "rms_log_residual": float(np.sqrt(np.mean(residuals**2)))}
    print(dumps(figures))
    return figures


if __name__ == "__main__":
    run_script(main)
