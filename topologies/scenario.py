"""A scenario from its Hydra config: the topology graph, the cluster the cost model sees, the cost context.

This is where a topology meets the cost model: ``topologies`` builds the graph, :mod:`simcore` receives
it (:class:`~simcore.cost.cluster.Cluster` from the graph, :class:`~simcore.cost.tasks.CostContext` on
the cluster).
"""

from __future__ import annotations

import dataclasses
import difflib

from simcore.collectives.constants import FABRICS
from simcore.config import (
    ConfigError,
    HardwareConfig,
    ModelConfig,
    TopologyConfig,
    WorkloadConfig,
    build_engine_config,
    build_workload,
)
from simcore.cost.cluster import Cluster
from simcore.cost.tasks import CostContext
from simcore.hardware import get_gpu
from simcore.models import get_model
from topologies.custom import load_topology_yaml
from topologies.presets import build_topology, preset_fabric

__all__ = ["build_graph", "build_cluster", "build_context", "model_of"]


def build_graph(topology: TopologyConfig, hardware: HardwareConfig):
    """The topology graph the config describes."""
    if topology.name == "custom":
        if not topology.path:
            raise ConfigError("topology.path: required when topology.name is custom")
        if getattr(topology, "fabric", None) is not None:
            raise ConfigError(f"topology.fabric: a custom topology names its fabric in its file (fabric: ib | efa | "
                              f"roce), got {topology.fabric!r}")
        return load_topology_yaml(topology.path)
    if topology.path:  # a file that would be silently left unread
        raise ConfigError(f"topology.path: {topology.path} is read only under topology=custom, "
                          f"got topology {topology.name}")
    if topology.num_nodes < 1:
        raise ConfigError(f"topology.num_nodes must be positive, got {topology.num_nodes}")
    if topology.oversubscription <= 0:
        raise ConfigError(f"topology.oversubscription must be positive, got {topology.oversubscription}")
    fabric = _fabric(topology)
    return build_topology(topology.name, num_nodes=topology.num_nodes, oversubscription=topology.oversubscription,
                          **({"fabric": fabric} if fabric else {}))


def _fabric(topology: TopologyConfig) -> str | None:
    """``topology.fabric`` where it changes the preset's network (``None``: the preset's own); a name no
    preset knows, or one the preset's name fixes otherwise (``h100-efa`` is EFA), is a :class:`ConfigError`
    naming the field and the closest fabrics."""
    fabric = getattr(topology, "fabric", None)
    if fabric is None:
        return None
    fixed = preset_fabric(topology.name)
    if fabric not in FABRICS:
        close = difflib.get_close_matches(str(fabric).lower(), FABRICS, n=2, cutoff=0.5)
        alias = _FABRIC_ALIASES.get(str(fabric).lower())
        hint = ", ".join(dict.fromkeys([alias] * bool(alias) + close)) or ", ".join(FABRICS)
        raise ConfigError(f"topology.fabric: unknown fabric {fabric!r} (closest: {hint}; known: {', '.join(FABRICS)})")
    if fixed is not None and fabric != fixed:
        raise ConfigError(f"topology.fabric: topology {topology.name} is {fixed} by name, got {fabric!r} "
                          f"(leave topology.fabric unset, or pick a preset of that fabric)")
    return None if fixed is not None else fabric


#: what people call the three fabrics, for the suggestion of an unknown one
_FABRIC_ALIASES = {"infiniband": "ib", "ndr": "ib", "hdr": "ib", "aws": "efa", "ethernet": "roce", "rocev2": "roce",
                   "spectrum-x": "roce", "eth": "roce"}


def build_cluster(topology: TopologyConfig, hardware: HardwareConfig):
    """Cluster for the cost model; the GPU comes from the topology, efficiencies from ``hardware``
    (``hardware.name``: ``auto``, the default, takes the topology's GPU; a named GPU must match it)."""
    cluster = Cluster.from_graph(build_graph(topology, hardware))
    if hardware.name != "auto" and hardware.name != cluster.gpu.name:
        get_gpu(hardware.name)  # validates the name
        raise ConfigError(f"hardware.name: {hardware.name!r} differs from topology {topology.name!r} "
                          f"which is built of {cluster.gpu.name!r}")
    if hardware.overrides:
        cluster = dataclasses.replace(cluster, gpu=cluster.gpu.with_overrides(**dict(hardware.overrides)))
    return cluster


def build_context(model: ModelConfig, hardware: HardwareConfig, topology: TopologyConfig,
                  workload: WorkloadConfig, sim=None):
    """The :class:`~simcore.cost.lowering.CostContext` of a composed config; with ``sim`` (the ``sim``
    node) its MoE routing reaches the proxy, which then prices the expected routing skew."""
    routing = None if sim is None else build_engine_config(sim).routing
    return CostContext(model=model_of(model), workload=build_workload(workload),
                       cluster=build_cluster(topology, hardware), routing=routing)


def model_of(model: ModelConfig):
    """The :class:`~simcore.models.ModelSpec` that ``model.name`` names; an unknown name or a bad
    ``config.json`` is a :class:`ConfigError` naming ``model.name`` and the closest known ids."""
    try:
        return get_model(model.name)
    except ValueError as exc:  # ModelConfigError is a ValueError too
        raise ConfigError(f"model.name: {exc}") from None
