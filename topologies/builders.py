"""Cluster topology builders: HGX nodes, rail-optimized and plain fat trees, GB200 NVL72 racks.

Model (flow level, every link both directions, rates per direction):

- NVLink: one logical ``nvswitch{d}`` node per NVLink domain (the four NVSwitch chips of an
  HGX board act as one non-blocking crossbar at flow level). Each GPU has a GPU -> nvswitch
  and an nvswitch -> GPU link at its full NVLink rate (H100: 18 x 25 GB/s = 450e9 B/s).
- Scale-out: one NIC per GPU (``nic{rank}``), GPU <-> NIC and NIC <-> leaf links at
  ``GpuSpec.nic_bandwidth_bytes_per_s`` (ConnectX-7 NDR: 400 Gb/s = 50e9 B/s).
- Leaves connect to every spine. A link between a leaf and a spine is the logical bundle
  of all cables between them: ``downlink capacity / (oversubscription * spines)``.

Latencies (per link, one direction; reasoned, the sources are secondary):

- :data:`NVLINK_LATENCY_S` = 0.25 us per GPU <-> NVSwitch link, so a GPU -> GPU NVLink
  transfer pays 0.5 us; NCCL's tuning model charges 0.6 us per NVLink hop with the LL
  protocol, software included (shared/reference/simulators.md section 3.2).
- :data:`NIC_LATENCY_S` = 0.7 us per GPU <-> NIC link: PCIe Gen5 traversal plus the
  ConnectX-7 pipeline on one side.
- :data:`SWITCH_LATENCY_S` = 0.2 us per InfiniBand switch traversal (vendor-derived pages
  quote 130-400 ns port to port for Quantum-2), split half on the link into the switch and
  half on the link out of it, so every path pays exactly one traversal per switch;
  plus :data:`CABLE_LATENCY_S` = 25 ns (about 5 m at 5 ns/m) per cable.

A same-rail GPU -> GPU transfer across one leaf therefore pays 1.65 us, a cross-leaf one
2.1 us, the order of NCCL's 2.7 us per network hop (LL protocol, software included).

Scale-out network (graph attribute ``fabric``, one of ``simcore.collectives.FABRICS``): ``ib``
InfiniBand NDR, ``efa`` AWS EFA (p5: 32 x 100 Gb/s per node, 4 per GPU), ``roce`` RoCE 400 GbE.
All give 400 Gb/s per GPU, so the graph's links are the same; the collective cost model charges each
its own calibrated NIC efficiency and per-hop latency (``NcclConstants.for_fabric``). The leaf/spine
shape is graph attribute ``layout`` (``rail``, ``fattree``, ``none``, ``custom``).
"""

from __future__ import annotations

import math

import networkx as nx

from simcore.collectives.constants import check_fabric
from simcore.hardware.gpus import GpuSpec, get_gpu
from simcore.network.cluster_graph import validate_topology

__all__ = [
    "NVLINK_LATENCY_S", "NIC_LATENCY_S", "SWITCH_LATENCY_S", "CABLE_LATENCY_S",
    "NVL72_NVLINK_BANDWIDTH_BYTES_PER_S", "hgx_h100", "ib_rail", "ib_fattree", "nvl72",
]

NVLINK_LATENCY_S = 0.25e-6
NIC_LATENCY_S = 0.7e-6
SWITCH_LATENCY_S = 0.2e-6
CABLE_LATENCY_S = 0.025e-6
_NIC_LEAF_LATENCY_S = CABLE_LATENCY_S + SWITCH_LATENCY_S / 2
_LEAF_SPINE_LATENCY_S = CABLE_LATENCY_S + SWITCH_LATENCY_S


def _link(graph: nx.DiGraph, u: str, v: str, bandwidth_bytes_per_s: float, latency_s: float) -> None:
    """Add both directions of a physical link."""
    graph.add_edge(u, v, bandwidth_bytes_per_s=float(bandwidth_bytes_per_s), latency_s=float(latency_s))
    graph.add_edge(v, u, bandwidth_bytes_per_s=float(bandwidth_bytes_per_s), latency_s=float(latency_s))


def _short(gpu: str) -> str:
    """Catalog name without the form factor: ``h100-sxm`` -> ``h100``."""
    return gpu.split("-")[0]


def _positive_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")
    return value


def _servers(graph: nx.DiGraph, spec: GpuSpec, num_nodes: int, gpus_per_node: int,
             nodes_per_domain: int, nvlink_bandwidth_bytes_per_s: float, with_nics: bool) -> None:
    """GPUs, NVLink domains (one logical NVSwitch each) and, optionally, one NIC per GPU."""
    for node in range(num_nodes):
        switch = f"nvswitch{node // nodes_per_domain}"
        graph.add_node(switch, kind="nvswitch", domain=node // nodes_per_domain)
        for local in range(gpus_per_node):
            rank = node * gpus_per_node + local
            gpu = f"gpu{rank}"
            graph.add_node(gpu, kind="gpu", node=node, local=local, domain=node // nodes_per_domain)
            _link(graph, gpu, switch, nvlink_bandwidth_bytes_per_s, NVLINK_LATENCY_S)
            if with_nics:
                graph.add_node(f"nic{rank}", kind="nic", node=node, local=local)
                _link(graph, gpu, f"nic{rank}", spec.nic_bandwidth_bytes_per_s, NIC_LATENCY_S)


def _spines(graph: nx.DiGraph, leaves: list[tuple[str, float]], spines: int, oversubscription: float) -> None:
    """Connect every leaf to every spine; ``leaves`` holds (name, downlink capacity)."""
    for s in range(spines):
        graph.add_node(f"spine{s}", kind="spine")
    for leaf, downlink_bytes_per_s in leaves:
        per_spine = downlink_bytes_per_s / (oversubscription * spines)
        for s in range(spines):
            _link(graph, leaf, f"spine{s}", per_spine, _LEAF_SPINE_LATENCY_S)


def _graph(name: str, gpu: str, num_nodes: int, gpus_per_node: int, domain: int, layout: str,
           nvlink: float, nic: float, fabric: str = "ib") -> nx.DiGraph:
    try:
        check_fabric(fabric)
    except ValueError as exc:
        raise ValueError(f"fabric: {exc}") from None
    return nx.DiGraph(name=name, gpu=gpu, num_nodes=num_nodes, gpus_per_node=gpus_per_node,
                      num_gpus=num_nodes * gpus_per_node, nvlink_domain_size=domain, layout=layout,
                      fabric=fabric, nvlink_bandwidth_bytes_per_s=nvlink, nic_bandwidth_bytes_per_s=nic)


def _check_fabric(oversubscription: float, spines: int | None, default_spines: int) -> int:
    if not (isinstance(oversubscription, int | float) and 0 < oversubscription < math.inf):
        raise ValueError(f"oversubscription must be a positive finite number, got {oversubscription!r}")
    return default_spines if spines is None else _positive_int("spines", spines)


def hgx_h100(gpu: str = "h100-sxm") -> nx.DiGraph:
    """One HGX/DGX server: 8 GPUs on one NVSwitch domain, no scale-out fabric.

    Parameters
    ----------
    gpu : str
        Hardware catalog name (``simcore.hardware.gpus.get_gpu``); sets the NVLink rate.

    Returns
    -------
    networkx.DiGraph
        8 GPUs and one ``nvswitch0``; links at the GPU's NVLink rate (bytes/s per direction).

    Examples
    --------
    >>> g = hgx_h100()
    >>> g.graph["num_gpus"], g["gpu0"]["nvswitch0"]["bandwidth_bytes_per_s"]
    (8, 450000000000.0)
    """
    spec = get_gpu(gpu)
    g = _graph(f"hgx-{_short(gpu)}", gpu, 1, spec.gpus_per_node,
               spec.gpus_per_node, "none", spec.nvlink_bandwidth_bytes_per_s, spec.nic_bandwidth_bytes_per_s)
    _servers(g, spec, 1, spec.gpus_per_node, 1, spec.nvlink_bandwidth_bytes_per_s, with_nics=False)
    return validate_topology(g)


def _rail_fabric(g: nx.DiGraph, spec: GpuSpec, num_nodes: int, gpus_per_node: int, nodes_per_leaf: int,
                 spines: int, oversubscription: float) -> None:
    """Leaf ``leaf{group * gpus_per_node + rail}`` takes NIC ``rail`` of each node of its group."""
    leaves = []
    for group in range(math.ceil(num_nodes / nodes_per_leaf)):
        members = range(group * nodes_per_leaf, min(num_nodes, (group + 1) * nodes_per_leaf))
        for rail in range(gpus_per_node):
            leaf = f"leaf{group * gpus_per_node + rail}"
            g.add_node(leaf, kind="leaf", rail=rail, group=group)
            for node in members:
                _link(g, f"nic{node * gpus_per_node + rail}", leaf, spec.nic_bandwidth_bytes_per_s,
                      _NIC_LEAF_LATENCY_S)
            leaves.append((leaf, len(members) * spec.nic_bandwidth_bytes_per_s))
    _spines(g, leaves, spines, oversubscription)


def ib_rail(num_nodes: int, gpu: str = "h100-sxm", oversubscription: float = 1.0, spines: int | None = None,
            nodes_per_leaf: int | None = None, fabric: str = "ib") -> nx.DiGraph:
    """HGX servers on a rail-optimized two-tier leaf/spine fabric (InfiniBand unless ``fabric`` says).

    NIC ``i`` of every server goes to rail leaf ``i`` (``leaf{i}``); with ``nodes_per_leaf``
    set, servers form groups (scalable units) of that many, each with its own rail leaves
    ``leaf{group * gpus_per_node + i}``. Every leaf connects to every spine with uplink
    capacity = downlink capacity / ``oversubscription``.

    Parameters
    ----------
    num_nodes : int
        Servers (8 GPUs each).
    gpu : str
        Hardware catalog name.
    oversubscription : float
        Leaf downlink / uplink capacity ratio (1 = non-blocking, 2 = half the uplink).
    spines : int, optional
        Spine switches; default one per rail (``gpus_per_node``).
    nodes_per_leaf : int, optional
        Servers per rail group; default all servers share one leaf per rail.
    fabric : str
        Scale-out network: ``ib``, ``efa`` or ``roce``.

    Examples
    --------
    >>> g = ib_rail(4)
    >>> g.graph["num_gpus"], sorted(g.successors("nic10"))
    (32, ['gpu10', 'leaf2'])
    """
    _positive_int("num_nodes", num_nodes)
    spec = get_gpu(gpu)
    per = spec.gpus_per_node
    spines = _check_fabric(oversubscription, spines, per)
    nodes_per_leaf = num_nodes if nodes_per_leaf is None else _positive_int("nodes_per_leaf", nodes_per_leaf)
    g = _graph(f"{_short(gpu)}-{fabric}-rail", gpu, num_nodes, per, per, "rail",
               spec.nvlink_bandwidth_bytes_per_s, spec.nic_bandwidth_bytes_per_s, fabric)
    _servers(g, spec, num_nodes, per, 1, spec.nvlink_bandwidth_bytes_per_s, with_nics=True)
    _rail_fabric(g, spec, num_nodes, per, nodes_per_leaf, spines, oversubscription)
    return validate_topology(g)


def ib_fattree(num_nodes: int, gpu: str = "h100-sxm", oversubscription: float = 1.0, nodes_per_leaf: int = 4,
               spines: int | None = None, fabric: str = "ib") -> nx.DiGraph:
    """HGX servers on a plain (not rail-optimized) two-tier leaf/spine fat tree.

    All NICs of ``nodes_per_leaf`` consecutive servers go to the same leaf (default 4
    servers = 32 NDR ports, half of a 64-port Quantum-2 switch); leaves connect to every
    spine with uplink capacity = downlink capacity / ``oversubscription``.

    Parameters
    ----------
    num_nodes : int
        Servers (8 GPUs each).
    gpu : str
        Hardware catalog name.
    oversubscription : float
        Leaf downlink / uplink capacity ratio (1 = non-blocking).
    nodes_per_leaf : int
        Servers per leaf switch.
    spines : int, optional
        Spine switches; default ``min(8, number of leaves)``.
    fabric : str
        Scale-out network: ``ib``, ``efa`` or ``roce``.

    Examples
    --------
    >>> g = ib_fattree(8)
    >>> sorted(n for n, k in g.nodes(data="kind") if k == "leaf"), sorted(g.successors("nic9"))
    (['leaf0', 'leaf1'], ['gpu9', 'leaf0'])
    """
    _positive_int("num_nodes", num_nodes)
    nodes_per_leaf = _positive_int("nodes_per_leaf", nodes_per_leaf)
    spec = get_gpu(gpu)
    per = spec.gpus_per_node
    num_leaves = math.ceil(num_nodes / nodes_per_leaf)
    spines = _check_fabric(oversubscription, spines, min(8, num_leaves))
    g = _graph(f"{_short(gpu)}-{fabric}-fattree", gpu, num_nodes, per, per, "fattree",
               spec.nvlink_bandwidth_bytes_per_s, spec.nic_bandwidth_bytes_per_s, fabric)
    _servers(g, spec, num_nodes, per, 1, spec.nvlink_bandwidth_bytes_per_s, with_nics=True)
    leaves = []
    for j in range(num_leaves):
        g.add_node(f"leaf{j}", kind="leaf", group=j)
        members = range(j * nodes_per_leaf, min(num_nodes, (j + 1) * nodes_per_leaf))
        for rank in range(members[0] * per, (members[-1] + 1) * per):
            _link(g, f"nic{rank}", f"leaf{j}", spec.nic_bandwidth_bytes_per_s, _NIC_LEAF_LATENCY_S)
        leaves.append((f"leaf{j}", len(members) * per * spec.nic_bandwidth_bytes_per_s))
    _spines(g, leaves, spines, oversubscription)
    return validate_topology(g)


#: GB200 NVL72: NVLink5 is 1.8 TB/s bidirectional per GPU = 900e9 B/s per direction (``get_gpu("gb200")``).
NVL72_NVLINK_BANDWIDTH_BYTES_PER_S = 900e9


def nvl72(num_nodes: int = 1, gpu: str = "gb200", oversubscription: float = 1.0,
          spines: int | None = None, fabric: str = "ib") -> nx.DiGraph:
    """GB200 NVL72 racks: 72 Blackwell GPUs in one NVLink5 domain per rack.

    Each GPU has ``gpu``'s compute, memory, NVLink and NIC rates (default ``gb200``: 900e9 B/s
    NVLink5 per direction, one 400 Gb/s NIC). Here a "node" is a whole rack (``gpus_per_node =
    nvlink_domain_size = 72``); GPU nodes also carry ``tray`` (18 compute trays of 4 GPUs). With
    several racks, one NIC per GPU joins a rail fabric (rail = GPU index inside the rack).

    Parameters
    ----------
    num_nodes : int
        Racks (72 GPUs each).
    gpu : str
        Catalog GPU of the rack (``gb200``; another name prices that GPU in an NVL72 layout).
    oversubscription, spines, fabric
        Of the scale-out rail fabric, as in :func:`ib_rail` (multi-rack only).

    Examples
    --------
    >>> g = nvl72()
    >>> g.graph["num_gpus"], g.graph["nvlink_domain_size"], g["gpu5"]["nvswitch0"]["bandwidth_bytes_per_s"]
    (72, 72, 900000000000.0)
    """
    _positive_int("num_nodes", num_nodes)
    spec = get_gpu(gpu)
    per = 72
    spines = _check_fabric(oversubscription, spines, 8)
    g = _graph("gb200-nvl72", gpu, num_nodes, per, per, "rail" if num_nodes > 1 else "none",
               spec.nvlink_bandwidth_bytes_per_s, spec.nic_bandwidth_bytes_per_s, fabric)
    _servers(g, spec, num_nodes, per, 1, spec.nvlink_bandwidth_bytes_per_s, with_nics=num_nodes > 1)
    for rank in range(num_nodes * per):
        g.nodes[f"gpu{rank}"]["tray"] = (rank % per) // 4
    if num_nodes > 1:
        _rail_fabric(g, spec, num_nodes, per, num_nodes, spines, oversubscription)
    return validate_topology(g)
