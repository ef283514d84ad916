"""Cluster topologies as ``networkx.DiGraph``: builders, named presets, YAML loader, helpers.

See :mod:`simcore.network.cluster_graph` for the graph conventions every builder follows.
"""

from __future__ import annotations

from simcore.network.cluster_graph import NODE_KINDS, gpu_nodes, node_of, validate_topology
from topologies.builders import hgx_h100, ib_fattree, ib_rail, nvl72
from topologies.custom import dump_topology_yaml, load_topology_yaml, topology_from_dict
from topologies.presets import TOPOLOGY_NAMES, build_topology

__all__ = [
    "NODE_KINDS", "TOPOLOGY_NAMES", "build_topology", "dump_topology_yaml", "gpu_nodes", "hgx_h100",
    "ib_fattree", "ib_rail", "load_topology_yaml", "node_of", "nvl72", "topology_from_dict",
    "validate_topology",
]
