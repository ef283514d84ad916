"""GPU hardware catalog: peak rates from the spec sheets plus a few calibrated efficiencies.

Everything is SI: FLOP/s, bytes, bytes/s, seconds. Hopper peak figures come from
``shared/reference/specs_h100.md``, Blackwell ones from the sources next to ``B200``/``GB200``; the
achievable fractions (``gemm_efficiency``,
``hbm_efficiency``, ``kernel_overhead_s`` ...) are fitted on published kernel
measurements by ``python -m validation.studies.kernels.fit`` (see that script for the data and
the fit) and copied here so the simulator needs no data at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["GpuSpec", "GPUS", "get_gpu", "PRECISION_BYTES"]

#: Bytes per element of weights / activations / KV cache for each precision.
PRECISION_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model and the node it sits in.

    Attributes are peak rates (``*_peak_*``), capacities, link rates per direction, and
    calibrated achievable fractions. ``gemm_efficiency[p]`` is the fraction of the dense
    tensor-core peak a large GEMM reaches at precision ``p``; smaller GEMMs lose further
    to wave quantization of ``gemm_tile`` x ``gemm_tile`` output tiles over ``num_sms``.
    """

    name: str
    peak_flops_per_s: dict[str, float]  # dense tensor-core peak by precision
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    nvlink_bandwidth_bytes_per_s: float  # per direction, all links of one GPU together
    nvlink_links: int
    nic_bandwidth_bytes_per_s: float  # one scale-out NIC per GPU, per direction
    gpus_per_node: int = 8
    num_sms: int = 132
    arch: str = "hopper"  # NCCL's tuning-table row: hopper (sm90) | blackwell (sm100)
    # Calibrated by `python -m validation.studies.kernels.fit` on validation/data/kernels_h100.csv (439 rows:
    # XLA BF16 GEMMs, cuBLASLt/DeepGEMM/torch FP8 GEMMs, STREAM, FlashAttention/FlashMLA); rounded.
    gemm_tile: int = 64  # effective output-tile granularity of wave quantization (grid 64/128/256)
    gemm_efficiency: dict[str, float] = dataclasses.field(default_factory=lambda: {"bf16": 0.79, "fp8": 0.64})
    attention_efficiency: float = 0.51  # fraction of bf16 peak a fused attention kernel reaches
    hbm_efficiency: float = 0.90  # fraction of peak HBM bandwidth a streaming kernel reaches
    kernel_overhead_s: float = 5.6e-6  # fixed launch + ramp + tail cost of one isolated kernel
    vector_flops_per_s: float = 66.9e12  # non-tensor FP32 rate, for element-wise work
    hbm_reserved_bytes: float = 4.0e9  # CUDA context, NCCL buffers, allocator slack
    # Host time of one step that no kernel covers (scheduling, input preparation, sampling), charged
    # once per step (a prefill pass, a decode step of every microbatch) beside the GPU's (simcore/cost/host.py).
    # Fitted with NcclConstants.launch_overhead_s by `python -m validation.studies.inference.fit` on the fit rows
    # of validation/data/inference_calibration.csv (TensorRT-LLM C++ benchmarks: eager, synchronous):
    # 1.75 ms, median |error| 7.0% (27 rows). Serving runtimes have their own (simcore/serving/runtime.py).
    iteration_overhead_s: float = 1.75e-3

    def __post_init__(self) -> None:
        for field in ("hbm_bytes", "hbm_bandwidth_bytes_per_s", "nvlink_bandwidth_bytes_per_s",
                      "nic_bandwidth_bytes_per_s", "gpus_per_node", "num_sms", "gemm_tile"):
            value = getattr(self, field)
            if not value > 0:
                raise ValueError(f"GpuSpec {self.name}: {field} must be positive, got {value!r}")
        for precision in PRECISION_BYTES:
            if precision not in self.peak_flops_per_s:
                raise ValueError(f"GpuSpec {self.name}: peak_flops_per_s lacks precision {precision!r}")
            if not 0 < self.gemm_efficiency.get(precision, 0) <= 1:
                raise ValueError(f"GpuSpec {self.name}: gemm_efficiency[{precision!r}] must be in (0, 1]")
        if not 0 < self.hbm_efficiency <= 1:
            raise ValueError(f"GpuSpec {self.name}: hbm_efficiency must be in (0, 1]")
        if not self.iteration_overhead_s >= 0:
            raise ValueError(f"GpuSpec {self.name}: iteration_overhead_s must be >= 0")
        if self.arch not in ("hopper", "blackwell"):
            raise ValueError(f"GpuSpec {self.name}: arch must be hopper or blackwell, got {self.arch!r}")

    def __hash__(self) -> int:  # dict fields make the default hash fail; names are unique
        return hash(self.name)

    @property
    def usable_hbm_bytes(self) -> float:
        return self.hbm_bytes - self.hbm_reserved_bytes

    def with_overrides(self, **changes: object) -> GpuSpec:
        """A copy with some fields replaced (e.g. calibrated efficiencies from config)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown hardware field(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)


_GB = 1e9

# H100 SXM5 "80 GB": 989.4 TFLOP/s dense BF16, 1978.9 FP8 (NVIDIA Hopper whitepaper via
# glennklockwood.com/garden/processors/h100); HBM3 at 3.35 TB/s (stas00 ml-engineering);
# NVLink4 18 links x 25 GB/s = 450 GB/s per direction; one ConnectX-7 NDR 400 Gb/s NIC per GPU
# (DGX H100 user guide). Efficiencies: validation/studies/kernels/fit.py on validation/data/kernels_h100.csv.
# hbm_bytes is the capacity the driver reports, not the marketing figure: NVIDIA's "80 GB" and
# "141 GB" are 81,559 MiB = 85.52e9 B and 143,771 MiB = 150.75e9 B in nvidia-smi (NVML; table in
# https://thundergolfer.com/blog/nvidia-gpu-memory-capacity), and the runtimes' memory fractions
# (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static) are fractions of that total; what
# CUDA itself keeps back (torch sees 79.11 GiB of an H100: vllm-project/vllm#27508) is part of
# hbm_reserved_bytes.
H100_SXM = GpuSpec(
    name="h100-sxm",
    peak_flops_per_s={"bf16": 989.4e12, "fp8": 1978.9e12},
    hbm_bytes=85.52 * _GB,
    hbm_bandwidth_bytes_per_s=3.35e12,
    nvlink_bandwidth_bytes_per_s=450 * _GB,
    nvlink_links=18,
    nic_bandwidth_bytes_per_s=400e9 / 8,
)

# H200 SXM 141 GB: same GH100 die and NVLink4 fabric as H100, HBM3e at 4.8 TB/s (NVIDIA H200 product
# page, as quoted in shared/reference/specs_h100.md for the 8x H200 sweep); 150.75e9 B as reported (above).
H200 = dataclasses.replace(H100_SXM, name="h200", hbm_bytes=150.75 * _GB, hbm_bandwidth_bytes_per_s=4.8e12)

# H800 SXM: the China-market Hopper; same SMs (DeepGEMM reaches 1358+ FP8 TFLOP/s on it), NVLink cut
# to 400 GB/s bidirectional = 200 GB/s per direction (NVIDIA/nccl issue #1374; DeepEP README).
H800 = dataclasses.replace(H100_SXM, name="h800", nvlink_bandwidth_bytes_per_s=200 * _GB, nvlink_links=8)

# Blackwell. Dense tensor peaks (without 2:4 sparsity, half NVIDIA's headline figures) from the table of
# stas00 ml-engineering compute/accelerator/README.md (B200 SXM 2250 BF16 / 4500 FP8 TFLOP/s, GB200 2500 /
# 5000): https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md. NVLink5: 18 links
# x 50 GB/s = 900e9 B/s per direction (1.8 TB/s bidirectional). 148 SMs (sm_100 device query of a B200). The
# efficiencies (GEMM, HBM, attention, kernel and iteration overheads) are Hopper's fitted fractions: no
# Blackwell measurement is in the fit set, so these are priors, not calibrations.
#
# B200 SXM6 as in HGX/DGX B200: 180 GB HBM3e (DGX B200: 1,440 GB for 8 GPUs) at 7.7 TB/s (NVIDIA lists
# 64 TB/s per 8-GPU board; 7.7 TB/s per GPU as tabulated by Verda's per-GPU Blackwell table,
# https://verda.com/blog/gb300-nvl72-architecture); one ConnectX-7 400 Gb/s NIC per GPU (DGX B200).
B200 = dataclasses.replace(
    H100_SXM, name="b200", peak_flops_per_s={"bf16": 2250e12, "fp8": 4500e12}, hbm_bytes=180 * _GB,
    hbm_bandwidth_bytes_per_s=7.7e12, nvlink_bandwidth_bytes_per_s=900 * _GB, nvlink_links=18,
    nic_bandwidth_bytes_per_s=400e9 / 8, num_sms=148, arch="blackwell", vector_flops_per_s=75e12)

# GB200 (one Blackwell GPU of a GB200 NVL72 rack): NVIDIA's rack figures 13.4 TB HBM3e and 576 TB/s over
# 72 GPUs give 186 GB at 8 TB/s per GPU (aiwiki.ai/wiki/nvidia_gb200_nvl72, quoting NVIDIA); 72 GPUs in one
# NVLink5 domain of 130 TB/s (1.8 TB/s per GPU). Scale-out NIC: ConnectX-7 400 Gb/s per GPU (the GB300
# generation moves to ConnectX-8 800 Gb/s: override nic_bandwidth_bytes_per_s for it). gpus_per_node = 72:
# as in the gb200-nvl72 topology, a "node" is the whole rack, one NVLink domain (18 trays of 4 GPUs).
GB200 = dataclasses.replace(
    B200, name="gb200", peak_flops_per_s={"bf16": 2500e12, "fp8": 5000e12}, hbm_bytes=186 * _GB,
    hbm_bandwidth_bytes_per_s=8.0e12, gpus_per_node=72)

GPUS: dict[str, GpuSpec] = {g.name: g for g in (H100_SXM, H200, H800, B200, GB200)}


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by catalog name; the error lists the valid names."""
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r}; choose one of: {', '.join(sorted(GPUS))}") from None
