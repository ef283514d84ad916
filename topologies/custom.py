"""Custom clusters from YAML.

Schema (see ``topologies/examples/small_cluster.yaml``)::

    name: small-cluster
    gpu: h100-sxm              # hardware catalog name
    num_nodes: 2               # servers
    gpus_per_node: 4           # GPUs gpu0..gpu{n-1} are implicit: node = rank // gpus_per_node
    nvlink_domain_size: 4      # optional, default gpus_per_node
    fabric: ib                 # optional scale-out network: ib (default) | efa | roce
    description: free text     # optional
    nodes:                     # every non-GPU node: name, kind, optional scalar attributes
      - {name: nvswitch0, kind: nvswitch}
    links:                     # both directions unless `directed: true`
      - {a: [gpu0, gpu1], b: nvswitch0, bandwidth_GBps: 450, latency_us: 0.25}

``a`` and ``b`` may be a name or a list of names (a link for every pair). Give the rate as
``bandwidth_GBps`` (1e9 bytes/s per direction) or ``bandwidth_bytes_per_s``, the latency
as ``latency_us`` or ``latency_s``; they are converted to SI here, at the boundary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from simcore.collectives.constants import FABRICS
from simcore.files import atomic_write_text
from simcore.hardware.gpus import get_gpu
from simcore.network.cluster_graph import NODE_KINDS, gpu_nodes, validate_topology

__all__ = ["load_topology_yaml", "topology_from_dict", "dump_topology_yaml"]

_TOP_KEYS = {"name", "gpu", "num_nodes", "gpus_per_node", "nvlink_domain_size", "fabric", "description",
             "nodes", "links"}
_LINK_KEYS = {"a", "b", "bandwidth_GBps", "bandwidth_bytes_per_s", "latency_us", "latency_s", "directed"}


def load_topology_yaml(path: str | Path) -> nx.DiGraph:
    """Read a cluster from a YAML file (schema in the module docstring) and validate it.

    Examples
    --------
    >>> from pathlib import Path
    >>> g = load_topology_yaml(Path(__file__).parent / "examples" / "small_cluster.yaml")
    >>> g.graph["num_gpus"], g["gpu0"]["nic0"]["bandwidth_bytes_per_s"]
    (8, 50000000000.0)
    """
    with open(path, encoding="utf-8") as fh:
        spec = yaml.safe_load(fh)
    if not isinstance(spec, dict):
        raise ValueError(f"topology file {str(path)!r}: top level must be a mapping")
    return topology_from_dict(spec)


def topology_from_dict(spec: dict[str, Any]) -> nx.DiGraph:
    """Build and validate a cluster from an already-parsed YAML mapping."""
    name = spec.get("name", "?")
    unknown = sorted(set(spec) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"topology {name!r}: unknown key {unknown[0]!r}; "
                         f"valid keys: {', '.join(sorted(_TOP_KEYS))}")
    for key in ("name", "gpu", "num_nodes", "gpus_per_node", "links"):
        if key not in spec:
            raise ValueError(f"topology {name!r}: required key {key!r} is missing")
    get_gpu(spec["gpu"])  # unknown hardware -> ValueError listing the catalog
    num_nodes, per_node = spec["num_nodes"], spec["gpus_per_node"]
    if not all(isinstance(v, int) and v > 0 for v in (num_nodes, per_node)):
        raise ValueError(f"topology {name!r}: num_nodes and gpus_per_node must be positive integers")
    domain = spec.get("nvlink_domain_size", per_node)
    fabric = str(spec.get("fabric", "ib"))
    if fabric not in FABRICS:
        raise ValueError(f"topology {name!r}: fabric: unknown fabric {fabric!r}; choose one of: "
                         f"{', '.join(FABRICS)}")
    graph = nx.DiGraph(name=str(name), gpu=spec["gpu"], num_nodes=num_nodes, gpus_per_node=per_node,
                       num_gpus=num_nodes * per_node, nvlink_domain_size=domain, layout="custom",
                       fabric=fabric)
    for rank in range(num_nodes * per_node):
        graph.add_node(f"gpu{rank}", kind="gpu", node=rank // per_node, local=rank % per_node,
                       domain=rank // domain if isinstance(domain, int) and domain > 0 else 0)
    for entry in spec.get("nodes") or []:
        _add_node(graph, name, entry)
    for entry in spec["links"]:
        _add_links(graph, name, entry)
    return validate_topology(graph)


def _add_node(graph: nx.DiGraph, name: str, entry: Any) -> None:
    if not isinstance(entry, dict) or "name" not in entry or "kind" not in entry:
        raise ValueError(f"topology {name!r}: node entry {entry!r} needs 'name' and 'kind'")
    node, kind = str(entry["name"]), entry["kind"]
    if kind not in NODE_KINDS or kind == "gpu":
        raise ValueError(f"topology {name!r}: node {node!r} kind {kind!r} must be one of "
                         f"{[k for k in NODE_KINDS if k != 'gpu']} (GPUs are implicit)")
    if node in graph:
        raise ValueError(f"topology {name!r}: node {node!r} is declared twice")
    graph.add_node(node, **{k: v for k, v in entry.items() if k != "name"})


def _si(entry: dict[str, Any], name: str, si_key: str, unit_key: str, scale: float) -> float:
    if (si_key in entry) == (unit_key in entry):
        raise ValueError(f"topology {name!r}: link {entry.get('a')!r}-{entry.get('b')!r} needs exactly "
                         f"one of {unit_key!r} or {si_key!r}")
    raw = entry[si_key] if si_key in entry else entry[unit_key]
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"topology {name!r}: link {entry.get('a')!r}-{entry.get('b')!r} field "
                         f"{si_key if si_key in entry else unit_key!r} is not a number: {raw!r}") from None
    return value if si_key in entry else value * scale


def _add_links(graph: nx.DiGraph, name: str, entry: Any) -> None:
    if not isinstance(entry, dict) or "a" not in entry or "b" not in entry:
        raise ValueError(f"topology {name!r}: link entry {entry!r} needs 'a' and 'b'")
    unknown = sorted(set(entry) - _LINK_KEYS)
    if unknown:
        raise ValueError(f"topology {name!r}: link {entry['a']!r}-{entry['b']!r} "
                         f"has unknown key {unknown[0]!r}")
    bandwidth = _si(entry, name, "bandwidth_bytes_per_s", "bandwidth_GBps", 1e9)
    latency = _si(entry, name, "latency_s", "latency_us", 1e-6)
    ends_a = entry["a"] if isinstance(entry["a"], list) else [entry["a"]]
    ends_b = entry["b"] if isinstance(entry["b"], list) else [entry["b"]]
    for a in map(str, ends_a):
        for b in map(str, ends_b):
            for end in (a, b):
                if end not in graph:
                    raise ValueError(f"topology {name!r}: link {a!r}-{b!r} names unknown node {end!r}")
            graph.add_edge(a, b, bandwidth_bytes_per_s=bandwidth, latency_s=latency)
            if not entry.get("directed", False):
                graph.add_edge(b, a, bandwidth_bytes_per_s=bandwidth, latency_s=latency)


def dump_topology_yaml(graph: nx.DiGraph, path: str | Path) -> None:
    """Write ``graph`` in the schema :func:`load_topology_yaml` reads (SI fields, exact floats).

    A link whose two directions carry equal attributes is written once; others as
    ``directed: true`` entries.
    """
    gpus = set(gpu_nodes(graph))
    nodes = [{"name": n, **dict(data)} for n, data in graph.nodes(data=True) if n not in gpus]
    links, done = [], set()
    for u, v, data in graph.edges(data=True):
        if (u, v) in done:
            continue
        entry = {"a": u, "b": v, "bandwidth_bytes_per_s": float(data["bandwidth_bytes_per_s"]),
                 "latency_s": float(data["latency_s"])}
        back = graph.get_edge_data(v, u)
        if back is not None and (back["bandwidth_bytes_per_s"], back["latency_s"]) == (
                data["bandwidth_bytes_per_s"], data["latency_s"]):
            done.add((v, u))
        else:
            entry["directed"] = True
        links.append(entry)
    keys = ("name", "gpu", "num_nodes", "gpus_per_node", "nvlink_domain_size")
    spec = {key: graph.graph[key] for key in keys}
    spec["fabric"] = graph.graph.get("fabric", "ib")
    spec.update(nodes=nodes, links=links)
    atomic_write_text(path, yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=200))
