"""Named cluster presets: ``build_topology("h100-ib-rail", num_nodes=16)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import networkx as nx

from topologies.builders import hgx_h100, ib_fattree, ib_rail, nvl72

__all__ = ["TOPOLOGY_NAMES", "build_topology", "preset_fabric"]

#: Servers of a multi-node preset when ``num_nodes`` is not given (16 GPUs).
DEFAULT_NUM_NODES = 2

def _one_hgx_node(gpu: str, num_nodes: int = 1, oversubscription: float = 1.0, fabric: str = "ib") -> nx.DiGraph:
    """:func:`hgx_h100` accepting the generic preset parameters (one node, no fabric)."""
    if num_nodes != 1:
        raise ValueError(f"num_nodes: the hgx presets are one node, got {num_nodes!r}; "
                         "use an ib preset for more")
    if not (isinstance(oversubscription, int | float) and oversubscription > 0):
        raise ValueError(f"oversubscription must be a positive number, got {oversubscription!r}")
    graph = hgx_h100(gpu)
    graph.graph["fabric"] = fabric  # no scale-out links; recorded for symmetry with the other presets
    return graph


# name -> (builder, fixed keyword arguments, defaults the caller may override)
_PRESETS: dict[str, tuple[Callable[..., nx.DiGraph], dict[str, Any], dict[str, Any]]] = {
    "hgx-h100": (_one_hgx_node, {"gpu": "h100-sxm"}, {}),
    "h100-ib-rail": (ib_rail, {"gpu": "h100-sxm"}, {"num_nodes": DEFAULT_NUM_NODES}),
    "h100-ib-fattree": (ib_fattree, {"gpu": "h100-sxm"}, {"num_nodes": DEFAULT_NUM_NODES}),
    "h200-ib-rail": (ib_rail, {"gpu": "h200"}, {"num_nodes": DEFAULT_NUM_NODES}),
    "h800-ib-rail": (ib_rail, {"gpu": "h800"}, {"num_nodes": DEFAULT_NUM_NODES}),
    # AWS p5.48xlarge: EFA (32 x 100 Gb/s per node = 400 Gb/s per GPU) on AWS's non-blocking Clos
    # (not rail-optimized: every NIC of a node under one leaf); p5en (H200) is the same per GPU
    "h100-efa": (ib_fattree, {"gpu": "h100-sxm", "fabric": "efa"}, {"num_nodes": DEFAULT_NUM_NODES}),
    "h200-efa": (ib_fattree, {"gpu": "h200", "fabric": "efa"}, {"num_nodes": DEFAULT_NUM_NODES}),
    # RoCE 400 GbE per GPU on a rail-optimized leaf/spine (NVIDIA Spectrum-X reference architecture)
    "h100-roce": (ib_rail, {"gpu": "h100-sxm", "fabric": "roce"}, {"num_nodes": DEFAULT_NUM_NODES}),
    "b200-ib-rail": (ib_rail, {"gpu": "b200"}, {"num_nodes": DEFAULT_NUM_NODES}),
    "gb200-nvl72": (nvl72, {"gpu": "gb200"}, {}),
}

#: Valid preset names for :func:`build_topology`.
TOPOLOGY_NAMES: tuple[str, ...] = tuple(_PRESETS)


def preset_fabric(name: str) -> str | None:
    """The scale-out fabric preset ``name`` fixes (``h100-efa``: ``efa``), ``None`` where it is a parameter
    (or ``name`` is no preset).

    >>> preset_fabric("h100-roce"), preset_fabric("h100-ib-rail")
    ('roce', None)
    """
    return _PRESETS[name][1].get("fabric") if name in _PRESETS else None


def build_topology(name: str, **params: Any) -> nx.DiGraph:
    """Build a named preset; ``params`` go to its builder.

    Presets: ``hgx-h100`` (:func:`hgx_h100`), ``h100-ib-rail`` / ``h200-ib-rail`` /
    ``h800-ib-rail`` / ``b200-ib-rail`` / ``h100-roce`` (:func:`ib_rail`), ``h100-ib-fattree`` /
    ``h100-efa`` / ``h200-efa`` (:func:`ib_fattree`), all defaulting to ``num_nodes=2``, and
    ``gb200-nvl72`` (:func:`nvl72`: GB200 GPUs, a node is a 72-GPU rack). Every preset accepts
    ``num_nodes`` and ``oversubscription`` (``hgx-h100`` only ``num_nodes=1``). The GPU model is
    fixed by the preset name; the scale-out ``fabric`` (``ib`` | ``efa`` | ``roce``) too where the
    name says it, and is a parameter elsewhere (``build_topology("h100-ib-rail", fabric="roce")``).

    Examples
    --------
    >>> build_topology("h100-ib-rail", num_nodes=4).graph["num_gpus"]
    32
    >>> build_topology("a100-pod")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown topology 'a100-pod'; choose one of: hgx-h100, h100-ib-rail, ...
    """
    if name not in _PRESETS:
        raise ValueError(f"unknown topology {name!r}; choose one of: {', '.join(TOPOLOGY_NAMES)}")
    builder, fixed, defaults = _PRESETS[name]
    clash = sorted(set(params) & set(fixed))
    if clash:
        raise ValueError(f"topology {name!r} fixes {clash[0]}={fixed[clash[0]]!r}; do not pass {clash[0]}")
    try:
        graph = builder(**{**defaults, **params, **fixed})
    except TypeError as exc:  # unexpected keyword: report it as a bad parameter, one line
        raise ValueError(f"topology {name!r}: bad parameter(s) {sorted(params)}: {exc}") from None
    graph.graph["name"] = name
    return graph
