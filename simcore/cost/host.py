"""The runtime around the kernels in the static path: per-step host time and how kernels are launched.

One model, shared by the proxy (:mod:`simcore.cost.proxy`, closed form) and the simulator
(:mod:`simcore.engine.simulate`, the same closed form applied to each simulated step), with the
serving runtimes' vocabulary (:class:`simcore.serving.runtime.RuntimeProfile`):

- **host time per step** (``GpuSpec.iteration_overhead_s``): scheduling, input preparation,
  sampling bookkeeping: paid once per step (one decode step of every microbatch, one prefill pass),
  not per microbatch, on a host timeline beside the GPU's. A synchronous runtime
  (``Workload.host_overlap`` false) adds it to the GPU step; an overlapped one (SGLang's and
  TensorRT-LLM's overlap schedulers) prepares step ``k + 1`` while step ``k`` runs, so a step takes
  ``max(GPU step, host)``.
- **CUDA-graph replay or eager launches** (``Workload.cuda_graphs``): replayed, each kernel's fixed
  cost is ``RuntimeProfile.graph_kernel_s`` (no launch, ramp-up and tail only); eager, it is
  ``GpuSpec.kernel_overhead_s`` (fitted on kernels launched one at a time), and a stage takes at least
  its kernels times the host's launch cost ``Workload.launch_s`` (0: a C++ runtime whose launches,
  ~2-4 us, stay under every kernel's 5.6 us fixed cost, so the GPU never waits on them; Python eager
  dispatch: ``simcore.serving.runtime.EAGER_LAUNCH_S``, 6 us).

Collectives: ``NcclConstants.launch_overhead_s`` is what the runtime adds to a collective beyond
NCCL's own latency; a runtime that keeps the host ahead of the GPU (C++ launches, graph replay) adds
nothing, as nccl-tests does (see that constant's comment).
"""

from __future__ import annotations

import numpy as np

__all__ = ["GRAPH_KERNEL_S", "graph_kernel_s", "kernel_fixed_s", "with_host", "launch_floor"]


#: Fixed time of one kernel inside a replayed CUDA graph (no launch, only the GPU's ramp-up and tail):
#: the default of every serving profile (``RuntimeProfile.graph_kernel_s``), measured by
#: ``validation/studies/serving/measure_launch.py``.
GRAPH_KERNEL_S = 2.0e-6


def graph_kernel_s() -> float:
    """Fixed time of one kernel inside a replayed CUDA graph: the serving profiles' default."""
    return GRAPH_KERNEL_S


def kernel_fixed_s(gpu, workload) -> float:
    """Fixed cost of one compute kernel under the workload's launch mode."""
    return graph_kernel_s() if workload.cuda_graphs else gpu.kernel_overhead_s


def with_host(gpu_step_s, host_s: float, overlap: bool):
    """A step's time given its GPU time and the host's: ``gpu + host`` (synchronous) or
    ``max(gpu, host)`` (overlapped); scalars or arrays."""
    if overlap:
        return np.maximum(gpu_step_s, host_s) if isinstance(gpu_step_s, np.ndarray) else max(gpu_step_s, host_s)
    return gpu_step_s + host_s


def launch_floor(stage_s, kernels, launch_s: float):
    """A stage's time of one microbatch when the host launches each of its ``kernels`` eagerly at
    ``launch_s`` apiece: the GPU cannot run ahead of its launches."""
    if launch_s <= 0:
        return stage_s
    return np.maximum(stage_s, np.asarray(kernels, dtype=float) * launch_s)
