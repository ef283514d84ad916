"""What the cost model needs to know about a cluster: the GPU, how many, and the NVLink domain size.

A :class:`Cluster` is derived from a topology graph (``topologies.build_topology``) so the proxy and
the simulator agree on the machine; the flow simulator uses the graph itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.collectives import Fabric
from simcore.hardware.gpus import GpuSpec, get_gpu

__all__ = ["Cluster", "group_ranks_per_domain"]


@dataclass(frozen=True)
class Cluster:
    """``num_gpus`` GPUs of type ``gpu`` in NVLink domains of ``nvlink_domain_size`` GPUs."""

    gpu: GpuSpec
    num_gpus: int
    nvlink_domain_size: int
    fabric: Fabric
    name: str = "cluster"

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ValueError(f"cluster.num_gpus must be positive, got {self.num_gpus}")
        if self.nvlink_domain_size < 1:
            raise ValueError(f"cluster.nvlink_domain_size must be positive, got {self.nvlink_domain_size}")

    @classmethod
    def from_graph(cls, graph) -> Cluster:
        """The cluster a topology graph describes (graph attributes ``gpu``, ``num_gpus``, ...)."""
        attrs = graph.graph
        gpu = get_gpu(attrs["gpu"])
        return cls(gpu=gpu, num_gpus=int(attrs["num_gpus"]),
                   nvlink_domain_size=int(attrs["nvlink_domain_size"]),
                   fabric=Fabric.from_topology(graph), name=str(attrs.get("name", "cluster")))

    @classmethod
    def simple(cls, gpu: str | GpuSpec = "h100-sxm", num_gpus: int = 8, nvlink_domain_size: int = 8) -> Cluster:
        """A cluster of HGX-style nodes without building a graph (tests, quick estimates)."""
        spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
        return cls(gpu=spec, num_gpus=num_gpus, nvlink_domain_size=nvlink_domain_size,
                   fabric=Fabric.from_gpu(spec, nvlink_domain_size=nvlink_domain_size),
                   name=f"{spec.name}x{num_gpus}")


def group_ranks_per_domain(size, stride, domain_size):
    """Ranks of a group (``size`` ranks, ``stride`` apart) that share one NVLink domain.

    Works on numpy arrays. A group whose stride reaches a whole domain has one rank per domain;
    otherwise ``domain_size // stride`` of its ranks sit together (capped by the group size).
    """
    size = np.asarray(size)
    stride = np.asarray(stride)
    per_domain = np.maximum(domain_size // np.maximum(stride, 1), 1)
    return np.where(stride >= domain_size, 1, np.minimum(size, per_domain))
