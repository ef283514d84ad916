"""The cost model: a strategy's tasks and their times, memory, and the roofline proxy.

- :mod:`simcore.cost.cluster`: what the cost model knows of a cluster (GPU, count, NVLink domain);
- :mod:`simcore.cost.tasks`: strategies as arrays, the cost context, tasks;
- :mod:`simcore.cost.lowering`: a strategy becomes the tasks one GPU runs per microbatch, with costs;
- :mod:`simcore.cost.host`: host time per step and kernel launches;
- :mod:`simcore.cost.memory`: per-GPU memory and validity reasons;
- :mod:`simcore.cost.proxy`: the proxy, the simulator with contention, overlap, skew and queueing off.
"""

from simcore.cost.cluster import Cluster
from simcore.cost.memory import memory_per_gpu_bytes, structural_reasons
from simcore.cost.proxy import ProxyResult, evaluate, evaluate_batch
from simcore.cost.tasks import CostContext, StrategyArrays

__all__ = ["Cluster", "CostContext", "ProxyResult", "StrategyArrays", "evaluate", "evaluate_batch",
           "memory_per_gpu_bytes", "structural_reasons"]
