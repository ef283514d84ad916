"""The kernel model's predictions against measured samples: predicted over measured time per row, error
figures per family (:data:`~validation.studies.kernels.rows.FAMILIES`)."""

from __future__ import annotations

import numpy as np

from simcore.hardware.gpus import GpuSpec
from simcore.hardware.kernels import DECODE_ATTENTION_FILL_S, attention_time_s, gemm_time_s, memory_time_s
from validation.studies.kernels.rows import FAMILIES, Sample

__all__ = ["predicted_over_measured", "evaluate"]


def predicted_over_measured(samples: list[Sample], gpu: GpuSpec, fill_s: float | None = None) -> np.ndarray:
    """pred / meas of time for every sample (for asymptotic rows: meas rate / model rate); decode
    attention rows add ``fill_s`` (default: the catalog's ``DECODE_ATTENTION_FILL_S``)."""
    fill_s = DECODE_ATTENTION_FILL_S if fill_s is None else fill_s
    ratio = np.empty(len(samples))
    for precision in ("bf16", "fp8"):
        idx = [i for i, s in enumerate(samples) if s.op == "gemm" and s.dims and s.precision == precision]
        if idx:
            m, n, k, count = np.array([samples[i].dims for i in idx]).T
            ratio[idx] = gemm_time_s(m, n, k, gpu, precision, count) / [samples[i].measured_s for i in idx]
    for op in ("attention", "memory"):
        idx = [i for i, s in enumerate(samples) if s.op == op and s.measured_s is not None]
        if idx:
            size = np.array([samples[i].size_bytes for i in idx])
            decode = np.array([samples[i].decode for i in idx])
            pred = (attention_time_s([samples[i].flops for i in idx], size, gpu, "bf16") + fill_s * decode
                    if op == "attention" else memory_time_s(size, gpu))
            ratio[idx] = pred / [samples[i].measured_s for i in idx]
    hbm_rate = gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency
    compute_rate = {"gemm": lambda p: gpu.peak_flops_per_s[p] * gpu.gemm_efficiency[p],
                    "attention": lambda p: gpu.peak_flops_per_s["bf16"] * gpu.attention_efficiency}
    for i, s in enumerate(samples):
        if s.measured_s is None:
            rate = hbm_rate if s.bound == "memory" or s.op == "memory" else compute_rate[s.op](s.precision)
            ratio[i] = s.measured_rate / rate
    return ratio


def evaluate(samples: list[Sample], gpu: GpuSpec,
             fill_s: float | None = None) -> tuple[np.ndarray, dict[str, dict[str, float]]]:
    """pred/meas per sample and, per family, rows, median |rel err|, geomean |err| and median signed err."""
    ratio = predicted_over_measured(samples, gpu, fill_s)
    stats = {}
    for family in FAMILIES:
        r = ratio[[s.family == family for s in samples]]
        if r.size:
            stats[family] = {"rows": int(r.size), "median_abs_rel_err": float(np.median(np.abs(r - 1.0))),
                             "geomean_abs_err": float(np.exp(np.mean(np.abs(np.log(r)))) - 1.0),
                             "median_rel_err": float(np.median(r - 1.0))}
    return ratio, stats
