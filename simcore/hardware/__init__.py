"""What a GPU is and how long one kernel takes on it.

- :mod:`simcore.hardware.gpus`: the GPU catalog (peak rates from spec sheets, calibrated efficiencies);
- :mod:`simcore.hardware.kernels`: the single-GPU roofline (GEMMs, attention, memory-bound kernels) that
  the proxy and the simulator share.
"""

from simcore.hardware.gpus import GPUS, PRECISION_BYTES, GpuSpec, get_gpu

__all__ = ["GPUS", "PRECISION_BYTES", "GpuSpec", "get_gpu"]
