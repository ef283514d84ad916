"""Single-GPU kernel time model: one roofline shared by the proxy and the simulator.

Every function takes Python floats or numpy arrays (broadcast together) and returns float64
seconds: a ``numpy.float64`` scalar for scalar inputs, an array otherwise. The only parameters
are the physical ones on :class:`~simcore.hardware.gpus.GpuSpec` (peak rates, SM count, output tile,
and the efficiencies fitted by ``python -m validation.studies.kernels.fit``); nothing depends on the
particular shape being a measured one.

A kernel costs ``max(compute time, memory time) + kernel_overhead_s``: compute and HBM traffic
overlap inside one fused kernel, while launch, ramp-up and tail do not.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from simcore.hardware.gpus import PRECISION_BYTES, GpuSpec
from simcore.xp import namespace

__all__ = ["gemm_flops", "gemm_bytes", "gemm_time_s", "attention_time_s", "memory_time_s", "DECODE_ATTENTION_FILL_S"]

#: Bytes per activation element entering a GEMM: BF16 models read BF16 activations; FP8 GEMMs
#: quantize their input activations to FP8 (the output stays BF16 either way).
_ACTIVATION_OUT_BYTES = 2.0
#: Fixed latency of a decode attention kernel beyond ``kernel_overhead_s`` (s): the KV-block chain and
#: the split-KV merge. Fitted by ``python -m validation.studies.kernels.fit`` (median residual of the fit
#: split's decode rows, H100: FlashAttention-2 paged decode timed with nvbench).
DECODE_ATTENTION_FILL_S = 1.17e-5


def _out(value) -> np.ndarray:
    """Return float64; 0-d results become a ``numpy.float64`` scalar."""
    if isinstance(value, float):
        return np.float64(value)
    return np.asarray(value, dtype=np.float64)[()]


def _floats(*values):
    """The backend for these inputs and the inputs in its types (float64 arrays or Python floats)."""
    xp = namespace(*values)
    if xp is np:
        return xp, [np.asarray(v, dtype=np.float64) for v in values]
    return xp, [float(v) for v in values]


def _check_precision(precision: str) -> None:
    if precision not in PRECISION_BYTES:
        raise ValueError(f"precision must be one of {sorted(PRECISION_BYTES)}, got {precision!r}")


def gemm_flops(m: ArrayLike, n: ArrayLike, k: ArrayLike, count: ArrayLike = 1) -> np.ndarray:
    """FLOPs of ``count`` GEMMs (m x k) @ (k x n): ``2 m n k count`` (one multiply-add = 2 FLOPs)."""
    _, (m, n, k, count) = _floats(m, n, k, count)
    return _out(2.0 * m * n * k * count)


def gemm_bytes(m: ArrayLike, n: ArrayLike, k: ArrayLike, precision: str, count: ArrayLike = 1,
               weight_bytes: float | None = None) -> np.ndarray:
    """HBM bytes of ``count`` GEMMs: weights ``k n`` and input ``m k`` at ``precision``, BF16 output ``m n``.

    Each operand is read from HBM once (an ideal tile order in which L2 catches the re-reads).
    ``weight_bytes`` overrides the bytes per weight element (weight-only quantized experts).
    """
    _check_precision(precision)
    _, (m, n, k, count) = _floats(m, n, k, count)
    elem = PRECISION_BYTES[precision]
    w_elem = elem if weight_bytes is None else float(weight_bytes)
    return _out(count * (k * n * w_elem + m * k * elem + m * n * _ACTIVATION_OUT_BYTES))


def _gemm_compute_s(xp, m: np.ndarray, n: np.ndarray, k: np.ndarray, count: np.ndarray,
                    gpu: GpuSpec, precision: str) -> np.ndarray:
    """Tensor-core time with wave quantization of output tiles and split-K (see :func:`gemm_time_s`)."""
    tile = float(gpu.gemm_tile)
    sms = float(gpu.num_sms)
    sm_flops_per_s = gpu.peak_flops_per_s[precision] * gpu.gemm_efficiency[precision] / sms
    tiles = xp.maximum(xp.ceil(m / tile) * xp.ceil(n / tile) * count, 1.0)
    waves = xp.ceil(tiles / sms)
    # Fewer tiles than SMs: split K over floor(sms / tiles) SMs per tile, each slice at least one
    # k-block deep (or all of k when k is shorter than a block).
    splits = xp.maximum(xp.floor(sms / tiles), 1.0)
    k_per_sm = xp.where(tiles < sms, xp.maximum(k / splits, xp.minimum(k, tile)), k)
    return waves * 2.0 * tile * tile * k_per_sm / sm_flops_per_s


def gemm_time_s(m: ArrayLike, n: ArrayLike, k: ArrayLike, gpu: GpuSpec, precision: str,
                count: ArrayLike = 1, weight_bytes: float | None = None) -> np.ndarray:
    """Time in s of ``count`` independent GEMMs (m x k) @ (k x n) run as one (grouped) kernel.

    ``max(compute_s, bytes / (hbm * hbm_efficiency)) + kernel_overhead_s`` with ``bytes`` from
    :func:`gemm_bytes`. ``compute_s`` models the tensor cores as ``num_sms`` SMs that each compute
    one ``gemm_tile x gemm_tile`` output tile at a time at ``peak[precision] * gemm_efficiency[precision]
    / num_sms``:

    * ``tiles = ceil(m / T) * ceil(n / T) * count``; partial tiles cost a full tile (tensor-core
      instructions have a fixed M x N shape), so time never drops when m or n grows.
    * ``tiles >= num_sms``: ``ceil(tiles / num_sms)`` waves of full-k tiles (wave quantization: a last
      partial wave costs a whole wave).
    * ``tiles < num_sms`` (decode and other small-m GEMMs): split-K spreads each tile over
      ``floor(num_sms / tiles)`` SMs, one wave of ``max(k / splits, min(k, T))``-deep slices. Without it
      an m=1 GEMM would be charged up to ``num_sms`` times too much compute; the split reduction is ignored.

    So a huge GEMM reaches ``peak * gemm_efficiency`` and an m=1 decode GEMM is memory bound. ``T`` is
    ``gemm_tile``: the fitted 64 (grid 64/128/256) stands for the library picking among tile shapes per
    GEMM, which quantizes more finely than one fixed 128 x 128 tile would.
    """
    _check_precision(precision)
    xp, (m, n, k, count) = _floats(m, n, k, count)
    compute_s = _gemm_compute_s(xp, m, n, k, count, gpu, precision)
    memory_s = gemm_bytes(m, n, k, precision, count, weight_bytes) / (gpu.hbm_bandwidth_bytes_per_s
                                                                      * gpu.hbm_efficiency)
    return _out(xp.maximum(compute_s, float(memory_s) if xp is not np else memory_s) + gpu.kernel_overhead_s)


def attention_time_s(flops: ArrayLike, size_bytes: ArrayLike, gpu: GpuSpec, precision: str,
                     decode: bool = False, hbm_share: float | None = None) -> np.ndarray:
    """Time in s of one fused (FlashAttention-style) attention kernel: ``flops`` and ``size_bytes`` of HBM.

    ``max(flops / (peak_bf16 * attention_efficiency), size_bytes / (hbm * hbm_efficiency)) + overhead``.
    The matrix products run at the BF16 rate whatever ``precision`` (serving kernels dequantize an FP8
    KV cache to BF16); ``precision`` is checked and the caller accounts for it in ``size_bytes``.

    ``decode`` (one query per sequence over a KV cache) adds :data:`DECODE_ATTENTION_FILL_S`: a decode
    kernel walks each sequence's KV blocks in a dependent chain (load K, score, softmax, load V) and
    merges the split-KV partial results, a fixed latency that small batches cannot hide.

    ``hbm_share``: the share of peak HBM bandwidth this kernel reaches where it is known to differ from a
    streaming kernel's ``hbm_efficiency`` (a timed kernel family, e.g. Gated DeltaNet's).
    """
    _check_precision(precision)
    xp, (flops, size_bytes) = _floats(flops, size_bytes)
    compute_s = flops / (gpu.peak_flops_per_s["bf16"] * gpu.attention_efficiency)
    memory_s = size_bytes / (gpu.hbm_bandwidth_bytes_per_s * (gpu.hbm_efficiency if hbm_share is None else hbm_share))
    fill_s = DECODE_ATTENTION_FILL_S if decode else 0.0
    return _out(xp.maximum(compute_s, memory_s) + gpu.kernel_overhead_s + fill_s)


def memory_time_s(size_bytes: ArrayLike, gpu: GpuSpec) -> np.ndarray:
    """Time in s of a memory-bound (element-wise, norm, copy) kernel moving ``size_bytes`` through HBM."""
    _, (size_bytes,) = _floats(size_bytes)
    return _out(size_bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency) + gpu.kernel_overhead_s)
