"""Lanes of the per-GPU engine: which GPUs one SimPy process stands for, and why that is exact.

Every GPU of a plan is rank ``(d, p, e, i)`` (:mod:`simcore.strategy.rank_placement`). Per-GPU mode gives
each GPU its own lane (processes and streams) unless permutations of a rank axis (``i``: tensor rank,
``d``: replica, ``e``: EP rank) are proven symmetries of the whole plan. The candidates are the
axis's shift by one and, for each divisor ``m`` of its size, the shift by ``m`` and the rotation
inside each block of ``m`` (an EP group of 16 with 4 ranks per node is not symmetric under the
shift by one, which takes a node's last rank to the next node, but is under the rotation inside
each node and the shift by a node). A candidate is a symmetry when it maps every communicator onto
another of the same kind and stage, keeps the order in which NCCL's plans walk its ranks (NVLink
domain, then local index), and maps every route its flows may take (each pair's own route, or the
PXN relay's two legs where NCCL takes them; both for DeepEP's kernels, :func:`.contention.flow_links`)
onto the image pair's route link by link, one link to one link of equal bandwidth and latency. Only
single routes map: where ECMP has a choice the hash of each pair picks its own, so a route that
branches is never proven (a communicator that takes its idle-fabric cost needs only an image of the
same shape that does too). For ``e`` every EP rank must also have the same work. The simulation is
then invariant under each proven permutation, so the GPUs of an orbit of the group they generate
run identical timelines and one lane stands for all of them (``tests/test_pergpu.py`` checks shared
lanes against one lane per GPU).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from simcore.engine.contention import all_groups

__all__ = ["Lane", "build_lanes", "lane_membership", "merged_axes", "symmetric_axes", "AXES"]

AXES = ("i", "d", "e")
_KINDS = ("tp", "ep", "pp")


@dataclass
class Lane:
    """``ranks``/``gpus``: the GPUs this lane's processes stand for (the members of one orbit);
    ``e``: the EP rank whose program it runs (all its GPUs share it)."""

    index: int
    stage: int
    e: int
    ranks: list[int]
    gpus: list[str]
    key: tuple[int, int, int] = (0, 0, 0)  # (d, e, i) of the chain through the stages, each its orbit's least


def _coords(s, rank: int) -> tuple[int, int, int, int]:
    i = rank % s.tp
    e = rank // s.tp % s.ep
    p = rank // (s.tp * s.ep) % s.pp
    d = rank // (s.tp * s.ep * s.pp)
    return d, p, e, i


def _candidates(n: int) -> list[tuple[str, int]]:
    """Permutations of an axis of size ``n`` to try, as ``(kind, m)``: the shift by one, then per
    divisor ``m`` the rotation inside blocks of ``m`` and the shift by ``m``."""
    out = [("shift", 1)]
    for m in range(2, n):
        if n % m == 0:
            out += [("rotate", m), ("shift", m)]
    return out


def _moved(x: int, n: int, perm: tuple[str, int]) -> int:
    kind, m = perm
    return (x + m) % n if kind == "shift" else x - x % m + (x % m + 1) % m


def _permute(s, rank: int, axis: str, perm: tuple[str, int]) -> int:
    d, p, e, i = _coords(s, rank)
    if axis == "i":
        i = _moved(i, s.tp, perm)
    elif axis == "d":
        d = _moved(d, s.dp, perm)
    else:
        e = _moved(e, s.ep, perm)
    return ((d * s.pp + p) * s.ep + e) * s.tp + i


def _canon(graph, ranks: list[str]) -> list[list[str]]:
    """The rank order NCCL-shaped plans use: by NVLink domain of first appearance, then local index."""
    doms: dict = {}
    for r in ranks:
        data = graph.nodes[r]
        doms.setdefault(data.get("domain", data.get("node")), []).append(r)
    return [sorted(g, key=lambda r: graph.nodes[r].get("local", 0)) for g in doms.values()]


class _Check:
    """Whether one permutation of the GPUs is a symmetry of the plan (module docstring)."""

    def __init__(self, placement, graph, network, sigma: dict, relay, order_free, contended, direct):
        self.placement, self.graph, self.network, self.sigma = placement, graph, network, sigma
        self.relay, self.order_free, self.contended, self.direct = relay, order_free, contended, direct
        self.link_map: dict = {}
        self.image_of: dict = {}

    def same_link(self, a, b) -> bool:
        if self.link_map.setdefault(a, b) != b or self.image_of.setdefault(b, a) != a:
            return False
        ea, eb = self.graph.edges[a], self.graph.edges[b]
        return (ea["bandwidth_bytes_per_s"] == eb["bandwidth_bytes_per_s"]
                and ea.get("latency_s", 0.0) == eb.get("latency_s", 0.0))

    def same_route(self, a, b) -> bool:
        """The one route of ``a -> b`` maps onto the one route of its image, link for link."""
        sa, sb = self.sigma.get(a, a), self.sigma.get(b, b)
        if self.network.forks(a, b) or self.network.forks(sa, sb):
            return False
        pa, pb = self.network.path(a, b), self.network.path(sa, sb)
        return len(pa) == len(pb) and all(self.same_link(x, y) for x, y in zip(pa, pb, strict=True))

    def pair(self, a, b, direct: bool) -> bool:
        """Every route a flow from ``a`` to ``b`` may take maps (:func:`.contention.flow_links`)."""
        sigma = self.sigma
        peer = self.relay(self.graph, a, b)
        if peer is None or peer in (a, b):
            return self.same_route(a, b)
        if peer not in sigma or sigma[peer] != self.relay(self.graph, sigma[a], sigma[b]):
            return False
        return self.same_route(a, peer) and self.same_route(peer, b) and (not direct or self.same_route(a, b))

    def group(self, kind: str, g: list[str], image: list[str], mapped: list[str]) -> bool:
        """Communicator ``g`` of ``kind`` onto ``mapped``, the one with the image's rank set."""
        graph, sigma = self.graph, self.sigma
        if self.contended is not None:
            if self.contended[(kind, tuple(g))] != self.contended[(kind, tuple(mapped))]:
                return False
            if not self.contended[(kind, tuple(g))]:  # idle-fabric cost of its shape: routes never matter
                return _shape(graph, g) == _shape(graph, image)
        if kind not in self.order_free and (mapped != image or _canon(graph, image)
                                            != [[sigma[x] for x in dom] for dom in _canon(graph, g)]):
            return False
        direct = kind in self.direct
        return all(self.pair(a, b, direct) for a in g for b in g if a != b)

    def holds(self) -> bool:
        s = self.placement.s
        for kind in _KINDS:
            for p in range(s.pp - (1 if kind == "pp" else 0)):
                groups = self.placement.groups(kind, p)
                by_set = {frozenset(g): k for k, g in enumerate(groups)}
                for g in groups:
                    image = [self.sigma[x] for x in g]
                    k = by_set.get(frozenset(image))
                    if k is None or not self.group(kind, g, image, groups[k]):
                        return False
        return True


def _is_symmetry(placement, graph, network, axis: str, perm: tuple[str, int], relay, order_free, contended,
                 direct) -> bool:
    s = placement.s
    sigma = {g: placement.gpu[_permute(s, r, axis, perm)] for r, g in enumerate(placement.gpu)}
    return _Check(placement, graph, network, sigma, relay, order_free, contended, direct).holds()


def _shape(graph, ranks) -> list[int]:
    return sorted(len(d) for d in _canon(graph, ranks))


def symmetric_axes(placement, graph, network, equal_ep_work: bool, relay, order_free=frozenset(),
                   contended: dict | None = None, direct=frozenset()) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Per rank axis, the orbits of its proven symmetries (``orbits[axis][x]``: the smallest coordinate
    that ``x`` is proven equivalent to; all 0: the axis merges whole), and for every axis that does
    not merge whole the reason.
    ``order_free``: communicator kinds whose every collective moves the same bytes between every
    pair (a direct all-to-all), so only their rank sets, not NCCL's rank order, must map.
    ``contended[(kind, ranks)]``: whether that communicator runs as flows; the routes of one that
    takes its idle-fabric cost need not map, only its shape (and the image must not contend either).
    ``direct``: kinds whose pairs may also take their own routes across rails (DeepEP's kernels).
    Memoized per graph on everything the answer depends on (a re-rank asks for one placement over
    and over: plans that differ only in batch, microbatches or sharding share it)."""
    s = placement.s
    key = (tuple(placement.gpu), s.tp, s.ep, s.pp, s.dp, network.seed, bool(equal_ep_work), relay,
           frozenset(order_free), None if contended is None else frozenset(k for k, f in contended.items() if f),
           frozenset(direct))
    memo = _MEMO.setdefault(graph, {})
    if key not in memo:
        memo[key] = _symmetric_axes(placement, graph, network, equal_ep_work, relay, order_free, contended, direct)
    orbits, why = memo[key]
    return {a: list(o) for a, o in orbits.items()}, dict(why)


_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> {inputs: (orbits, why)}


def _symmetric_axes(placement, graph, network, equal_ep_work, relay, order_free, contended, direct):
    s = placement.s
    size = {"i": s.tp, "d": s.dp, "e": s.ep}
    orbits, why = {}, {}
    for axis in AXES:
        n = size[axis]
        parent = list(range(n))
        if axis == "e" and not equal_ep_work:
            why[axis] = "EP ranks have different routed work"
        else:
            for perm in _candidates(n):
                if _components(parent) == 1:
                    break
                if _is_symmetry(placement, graph, network, axis, perm, relay, order_free, contended, direct):
                    for x in range(n):
                        _union(parent, x, _moved(x, n, perm))
            if _components(parent) > 1:
                why[axis] = "placement or fabric is not symmetric along it"
        orbits[axis] = [_find(parent, x) for x in range(n)]
    return orbits, why


def _find(parent: list[int], x: int) -> int:
    while parent[x] != x:
        x = parent[x]
    return x


def _union(parent: list[int], a: int, b: int) -> None:
    ra, rb = _find(parent, a), _find(parent, b)
    parent[max(ra, rb)] = min(ra, rb)  # the root is the orbit's smallest coordinate


def _components(parent: list[int]) -> int:
    return sum(1 for x, p in enumerate(parent) if x == p)


def merged_axes(orbits: dict[str, list[int]]) -> list[str]:
    """The axes whose whole coordinate range is one orbit."""
    return [a for a in AXES if a in orbits and not any(orbits[a])]


def build_lanes(placement, orbits: dict[str, list[int]] | None = None) -> list[Lane]:
    """One lane per orbit of the proven symmetries (one per GPU when there are none), stage by stage."""
    s = placement.s
    orbits = orbits or {}
    rep = {a: orbits.get(a) or list(range(n)) for a, n in (("i", s.tp), ("d", s.dp), ("e", s.ep))}
    lanes: dict[tuple, Lane] = {}
    for rank in range(s.gpus):
        d, p, e, i = _coords(s, rank)
        key = (p, rep["d"][d], rep["e"][e], rep["i"][i])
        lane = lanes.get(key)
        if lane is None:
            lane = lanes[key] = Lane(0, p, key[2], [], [], key[1:])
        lane.ranks.append(rank)
        lane.gpus.append(placement.gpu[rank])
    out = sorted(lanes.values(), key=lambda ln: (ln.stage, _coords(s, ln.ranks[0])))
    for k, lane in enumerate(out):
        lane.index = k
    return out


def lane_membership(placement, lanes) -> tuple[list, list, list, list, dict]:
    """Every communicator of the plan and who takes part: ``(groups, participants, takers, sm_share,
    lane_groups)``. ``groups[gid]``: ``(kind, ranks)``; ``participants[gid]``: the lanes taking part;
    ``takers[gid]``: the GPUs whose communication stream it occupies (a send's: its sender);
    ``sm_share[gid]``: per lane, the share of its GPUs taking part; ``lane_groups[(lane, kind)]``: the
    communicators of that kind a lane takes part in."""
    lane_of = {g: lane.index for lane in lanes for g in lane.gpus}
    groups: list[tuple[str, list[str]]] = []
    participants: list[set[int]] = []
    takers: list[frozenset[str]] = []
    sm_share: list[dict[int, float]] = []
    lane_groups: dict[tuple[int, str], list[int]] = {}
    for gid, (kind, ranks) in enumerate(all_groups(placement)):
        groups.append((kind, ranks))
        members = ranks[:1] if kind == "pp" else ranks
        lanes_in = {lane_of[g] for g in members}
        participants.append(lanes_in)
        takers.append(frozenset(members))
        share: dict[int, float] = {}
        for g in members:
            share[lane_of[g]] = share.get(lane_of[g], 0.0) + 1.0 / len(lanes[lane_of[g]].gpus)
        sm_share.append(share)
        for lane in lanes_in:
            lane_groups.setdefault((lane, kind), []).append(gid)
    return groups, participants, takers, sm_share, lane_groups
