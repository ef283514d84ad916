"""Conventions shared by every cluster graph: node kinds, rank order, and validation.

A cluster is a :class:`networkx.DiGraph`. Nodes carry ``kind`` in :data:`NODE_KINDS`;
GPU nodes are named ``gpu{rank}`` and carry ``node`` (server index) and ``local`` (index
inside the server). Every directed edge is one direction of a physical link and carries
``bandwidth_bytes_per_s`` (per direction) and ``latency_s``. ``graph.graph`` holds
``name``, ``gpu`` (hardware catalog name), ``num_nodes``, ``gpus_per_node``, ``num_gpus``
and ``nvlink_domain_size``.

Routing convention (used by :class:`simcore.network.flownet.FlowNetwork` and by the reachability
check here): a GPU is an endpoint only, traffic never transits through a GPU.
"""

from __future__ import annotations

import math

import networkx as nx

__all__ = ["NODE_KINDS", "GRAPH_ATTRS", "gpu_nodes", "node_of", "validate_topology"]

#: The node kinds a cluster graph may contain.
NODE_KINDS: tuple[str, ...] = ("gpu", "nvswitch", "nic", "leaf", "spine")

#: Attributes every cluster graph carries in ``graph.graph``.
GRAPH_ATTRS: tuple[str, ...] = ("name", "gpu", "num_nodes", "gpus_per_node", "num_gpus", "nvlink_domain_size")


def gpu_nodes(graph: nx.DiGraph) -> list[str]:
    """GPU node names in rank order (``gpu0``, ``gpu1``, ...).

    Examples
    --------
    >>> from topologies import hgx_h100
    >>> gpu_nodes(hgx_h100())[:3]
    ['gpu0', 'gpu1', 'gpu2']
    """
    gpus = [n for n, kind in graph.nodes(data="kind") if kind == "gpu"]
    return sorted(gpus, key=_rank)


def node_of(graph: nx.DiGraph, gpu: str) -> int:
    """Server index of GPU ``gpu``.

    Examples
    --------
    >>> from topologies import ib_rail
    >>> node_of(ib_rail(2), "gpu9")
    1
    """
    if gpu not in graph or graph.nodes[gpu].get("kind") != "gpu":
        raise ValueError(f"node_of: {gpu!r} is not a GPU of topology {graph.graph.get('name')!r}")
    return int(graph.nodes[gpu]["node"])


def _rank(name: str) -> int:
    if not (name.startswith("gpu") and name[3:].isdigit()):
        raise ValueError(f"GPU node {name!r}: GPU nodes must be named gpu<rank>")
    return int(name[3:])


def validate_topology(graph: nx.DiGraph) -> nx.DiGraph:
    """Check a cluster graph and return it unchanged.

    Checks: the graph attributes are present and consistent, node kinds are known, GPUs
    are ``gpu0..gpu{n-1}`` with ``node``/``local`` inside range, every link has a positive
    finite bandwidth and a finite non-negative latency, the graph is connected, every GPU
    reaches every other GPU without transiting a GPU, and in a multi-node cluster every
    GPU has a NIC. Raises ``ValueError`` with one line naming the bad node, link or field.
    """
    name = graph.graph.get("name", "?")
    for attr in GRAPH_ATTRS:
        if attr not in graph.graph:
            raise ValueError(f"topology {name!r}: graph attribute {attr!r} is missing")
    _check_nodes(graph, name)
    _check_links(graph, name)
    _check_connected(graph, name)
    if graph.graph["num_nodes"] > 1:
        _check_nics(graph, name)
    _check_gpu_reachability(graph, name)
    return graph


def _check_nodes(graph: nx.DiGraph, name: str) -> None:
    for attr in ("num_nodes", "gpus_per_node", "num_gpus", "nvlink_domain_size"):
        value = graph.graph[attr]
        if not (isinstance(value, int) and value > 0):
            raise ValueError(f"topology {name!r}: {attr} must be a positive integer, got {value!r}")
    for node, kind in graph.nodes(data="kind"):
        if kind not in NODE_KINDS:
            raise ValueError(f"topology {name!r}: node {node!r} has kind {kind!r}, "
                             f"expected one of {NODE_KINDS}")
    gpus = gpu_nodes(graph)
    num_gpus, per_node = graph.graph["num_gpus"], graph.graph["gpus_per_node"]
    if gpus != [f"gpu{i}" for i in range(num_gpus)]:
        raise ValueError(f"topology {name!r}: num_gpus={num_gpus} but GPU nodes are {len(gpus)} "
                         "(expected gpu0..gpu{num_gpus-1})")
    if num_gpus != graph.graph["num_nodes"] * per_node:
        raise ValueError(f"topology {name!r}: num_gpus={num_gpus} != num_nodes * gpus_per_node")
    for gpu in gpus:
        data = graph.nodes[gpu]
        node, local = data.get("node", -1), data.get("local", -1)
        if not (isinstance(node, int) and isinstance(local, int)
                and 0 <= node < graph.graph["num_nodes"] and 0 <= local < per_node):
            raise ValueError(f"topology {name!r}: GPU {gpu!r} has node={data.get('node')!r} "
                             f"local={data.get('local')!r} outside the cluster")


def _check_links(graph: nx.DiGraph, name: str) -> None:
    for u, v, data in graph.edges(data=True):
        bw = data.get("bandwidth_bytes_per_s")
        if not (isinstance(bw, int | float) and bw > 0 and math.isfinite(bw)):
            raise ValueError(f"topology {name!r}: link ({u!r}, {v!r}) bandwidth_bytes_per_s must be positive "
                             f"and finite, got {bw!r}")
        lat = data.get("latency_s")
        if not (isinstance(lat, int | float) and lat >= 0 and math.isfinite(lat)):
            raise ValueError(f"topology {name!r}: link ({u!r}, {v!r}) latency_s must be non-negative "
                             f"and finite, got {lat!r}")


def _check_connected(graph: nx.DiGraph, name: str) -> None:
    if graph.number_of_nodes() == 0:
        raise ValueError(f"topology {name!r}: graph has no nodes")
    start = next(iter(graph))
    reached = nx.node_connected_component(graph.to_undirected(as_view=True), start)
    if len(reached) != graph.number_of_nodes():
        stray = next(n for n in graph if n not in reached)
        raise ValueError(f"topology {name!r}: graph is disconnected: node {stray!r} "
                         f"is not connected to {start!r}")


def _check_nics(graph: nx.DiGraph, name: str) -> None:
    for gpu in gpu_nodes(graph):
        if not any(graph.nodes[v].get("kind") == "nic" for v in graph.successors(gpu)):
            raise ValueError(f"topology {name!r}: GPU {gpu!r} has no NIC "
                             "(a multi-node cluster needs one per GPU)")


def _check_gpu_reachability(graph: nx.DiGraph, name: str) -> None:
    """Every GPU reaches every other one without transiting a GPU.

    Works on the condensation of the non-GPU fabric: GPU ``a`` reaches GPU ``b`` when a
    direct edge joins them or a fabric component ``a`` sends into reaches one that sends
    into ``b``. GPUs are grouped by those component sets, so a 1024-GPU cluster costs a few
    thousand set operations instead of 1024 breadth-first searches.
    """
    gpus = gpu_nodes(graph)
    if len(gpus) < 2:
        return
    gpu_set = set(gpus)
    fabric = graph.subgraph(n for n in graph if n not in gpu_set)
    cond = nx.condensation(fabric)
    comp = cond.graph["mapping"]
    below = {c: frozenset(nx.descendants(cond, c) | {c}) for c in cond}
    reach_of: dict[frozenset, list[str]] = {}
    feed_of: dict[frozenset, list[str]] = {}
    for g in gpus:
        reach = frozenset().union(*(below[comp[v]] for v in graph.successors(g) if v not in gpu_set))
        reach_of.setdefault(reach, []).append(g)
        feed = frozenset(comp[u] for u in graph.predecessors(g) if u not in gpu_set)
        feed_of.setdefault(feed, []).append(g)
    for reach, sources in reach_of.items():
        for feed, targets in feed_of.items():
            if reach & feed:
                continue
            for src in sources:
                direct = set(graph.successors(src))
                for dst in targets:
                    if dst != src and dst not in direct:
                        raise ValueError(f"topology {name!r}: GPU {src!r} cannot reach GPU {dst!r}")
