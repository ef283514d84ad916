"""The cluster network: the graph every topology builder follows, and the flow-level simulator on it.

- :mod:`simcore.network.cluster_graph`: node kinds, link attributes and the checks a cluster graph
  passes (``topologies`` builds graphs in this form; the simulator receives one);
- :mod:`simcore.network.flownet`: :class:`FlowNetwork`, SimPy flows sharing links max-min fairly;
- :mod:`simcore.network.maxmin`: progressive filling, vectorized;
- :mod:`simcore.network.ecmp`: shortest-path ECMP routes;
- :mod:`simcore.network.chainset`: a prepared, repeated transfer of chains.
"""

from simcore.network.cluster_graph import NODE_KINDS, gpu_nodes, node_of, validate_topology
from simcore.network.flownet import ROUTINGS, FlowNetwork

__all__ = ["NODE_KINDS", "ROUTINGS", "FlowNetwork", "gpu_nodes", "node_of", "validate_topology"]
