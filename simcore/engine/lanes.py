"""Lanes of the per-GPU engine: which GPUs one SimPy process stands for, and why that is exact.

Every GPU of a plan is rank ``(d, p, e, i)`` (:mod:`simcore.engine.placement`). Per-GPU mode gives
each GPU its own lane (processes and streams) unless a shift along a rank axis (``i``: tensor rank,
``d``: replica, ``e``: EP rank) is proven to be a symmetry of the whole plan: it maps every
communicator onto another of the same kind and stage, keeps the order in which NCCL's plans walk
its ranks (NVLink domain, then local index), maps every route of every pair of every communicator
(and its PXN relay) onto the route of the image pair link by link, one link to one link of equal
bandwidth and latency (for communicators that run as flows; one that takes its idle-fabric cost needs
an image of the same shape that does too), and (for ``e``) every EP rank has the same work. The simulation is then
invariant under the shift, so the GPUs of an orbit run identical timelines and one lane stands for
all of them (``tests/test_pergpu.py`` checks shared lanes against one lane per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Lane", "build_lanes", "symmetric_axes", "AXES"]

AXES = ("i", "d", "e")
_KINDS = ("tp", "ep", "pp")


@dataclass
class Lane:
    """``ranks``/``gpus``: the GPUs this lane's processes stand for (one rank per merged orbit member);
    ``e``: the EP rank whose program it runs (all its GPUs share it)."""

    index: int
    stage: int
    e: int
    ranks: list[int]
    gpus: list[str]
    key: tuple[int, int, int] = (0, 0, 0)  # (d, e, i) of the chain through the stages, merged axes at 0


def _coords(s, rank: int) -> tuple[int, int, int, int]:
    i = rank % s.tp
    e = rank // s.tp % s.ep
    p = rank // (s.tp * s.ep) % s.pp
    d = rank // (s.tp * s.ep * s.pp)
    return d, p, e, i


def _shift(s, rank: int, axis: str) -> int:
    d, p, e, i = _coords(s, rank)
    if axis == "i":
        i = (i + 1) % s.tp
    elif axis == "d":
        d = (d + 1) % s.dp
    else:
        e = (e + 1) % s.ep
    return ((d * s.pp + p) * s.ep + e) * s.tp + i


def _canon(graph, ranks: list[str]) -> list[list[str]]:
    """The rank order NCCL-shaped plans use: by NVLink domain of first appearance, then local index."""
    doms: dict = {}
    for r in ranks:
        data = graph.nodes[r]
        doms.setdefault(data.get("domain", data.get("node")), []).append(r)
    return [sorted(g, key=lambda r: graph.nodes[r].get("local", 0)) for g in doms.values()]


def _axis_is_symmetry(placement, graph, network, axis: str, relay, order_free=frozenset(),
                      contended: dict | None = None) -> bool:
    s = placement.s
    inverse = {g: r for r, g in enumerate(placement.gpu)}
    sigma = {g: placement.gpu[_shift(s, r, axis)] for g, r in inverse.items()}
    link_map: dict = {}
    image_of: dict = {}
    edges = graph.edges

    def same_link(a, b) -> bool:
        if link_map.setdefault(a, b) != b or image_of.setdefault(b, a) != a:
            return False
        ea, eb = edges[a], edges[b]
        return (ea["bandwidth_bytes_per_s"] == eb["bandwidth_bytes_per_s"]
                and ea.get("latency_s", 0.0) == eb.get("latency_s", 0.0))

    def same_route(a, b) -> bool:
        pa, pb = network.path(a, b), network.path(sigma.get(a, a), sigma.get(b, b))
        return len(pa) == len(pb) and all(same_link(x, y) for x, y in zip(pa, pb, strict=True))

    for kind in _KINDS:
        for p in range(s.pp - (1 if kind == "pp" else 0)):
            groups = placement.groups(kind, p)
            free = kind in order_free  # its collectives treat every pair alike (direct all-to-all)
            by_set = {frozenset(g): k for k, g in enumerate(groups)}
            for g in groups:
                image = [sigma[x] for x in g]
                k = by_set.get(frozenset(image))
                if k is None:
                    return False
                if contended is not None:
                    if contended[(kind, tuple(g))] != contended[(kind, tuple(groups[k]))]:
                        return False
                    if not contended[(kind, tuple(g))]:  # idle-fabric cost of its shape: routes never matter
                        if _shape(graph, g) != _shape(graph, image):
                            return False
                        continue
                if not free and (groups[k] != image
                                 or _canon(graph, image) != [[sigma[x] for x in dom] for dom in _canon(graph, g)]):
                    return False
                for a in g:
                    for b in g:
                        if a == b:
                            continue
                        peer = relay(graph, a, b)
                        if peer is not None and peer not in (a, b):
                            if peer not in sigma or sigma[peer] != relay(graph, sigma[a], sigma[b]):
                                return False
                            if not (same_route(a, peer) and same_route(peer, b)):
                                return False
                        if not same_route(a, b):
                            return False
    return True


def _shape(graph, ranks) -> list[int]:
    return sorted(len(d) for d in _canon(graph, ranks))


def symmetric_axes(placement, graph, network, equal_ep_work: bool, relay, order_free=frozenset(),
                   contended: dict | None = None) -> tuple[list[str], dict[str, str]]:
    """The rank axes whose shift is a proven symmetry, and for every other axis the reason.
    ``order_free``: communicator kinds whose every collective moves the same bytes between every
    pair (a direct all-to-all), so only their rank sets, not NCCL's rank order, must map.
    ``contended[(kind, ranks)]``: whether that communicator runs as flows; the routes of one that
    takes its idle-fabric cost need not map, only its shape (and the image must not contend either)."""
    s = placement.s
    size = {"i": s.tp, "d": s.dp, "e": s.ep}
    axes, why = [], {}
    for axis in AXES:
        if size[axis] == 1:
            axes.append(axis)
        elif axis == "e" and not equal_ep_work:
            why[axis] = "EP ranks have different routed work"
        elif _axis_is_symmetry(placement, graph, network, axis, relay, order_free, contended):
            axes.append(axis)
        else:
            why[axis] = "placement or fabric is not symmetric along it"
    return axes, why


def build_lanes(placement, merged: list[str]) -> list[Lane]:
    """One lane per orbit of the merged axes (one per GPU when none is merged), stage by stage."""
    s = placement.s
    lanes: dict[tuple, Lane] = {}
    for rank in range(s.gpus):
        d, p, e, i = _coords(s, rank)
        key = (p, 0 if "d" in merged else d, 0 if "e" in merged else e, 0 if "i" in merged else i)
        lane = lanes.get(key)
        if lane is None:
            lane = lanes[key] = Lane(0, p, key[2], [], [], key[1:])
        lane.ranks.append(rank)
        lane.gpus.append(placement.gpu[rank])
    out = sorted(lanes.values(), key=lambda ln: (ln.stage, _coords(s, ln.ranks[0])))
    for k, lane in enumerate(out):
        lane.index = k
    return out
