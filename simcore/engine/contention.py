"""Which communicators of a plan may contend: every link a communicator's flows may use, and whether
another communicator that can run at the same time shares one (:func:`contention_flags`)."""

from __future__ import annotations

import weakref

from simcore.collectives.links import flow_links

__all__ = ["all_groups", "contention_flags", "direct_kinds", "flow_links"]

_KINDS = ("tp", "ep", "pp")


def all_groups(placement) -> list[tuple[str, list[str]]]:
    """Every communicator of the plan as ``(kind, ranks)``: tp and ep per stage, pp per stage pair."""
    s = placement.s
    return [(kind, ranks) for kind in _KINDS for p in range(s.pp - (1 if kind == "pp" else 0))
            for ranks in placement.groups(kind, p)]


_FLAGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> {(groups, seed): flags}


def contention_flags(graph, network, groups: list[tuple[str, list[str]]],
                     direct_kinds: frozenset = frozenset()) -> list[bool]:
    """Per communicator, whether another one shares a link with it and no participating GPU (one
    that shares a participant can never run at the same time: one communication stream per GPU;
    a send's participant is its sender). ``direct_kinds``: communicator kinds whose pairs may also
    take their own routes (:func:`flow_links`). Memoized per graph, communicators and routing seed."""
    key = (tuple((k, tuple(r)) for k, r in groups), network.seed, frozenset(direct_kinds))
    cache = _FLAGS.setdefault(graph, {})
    if key not in cache:
        cache[key] = _contention_flags(graph, network, groups, frozenset(direct_kinds))
    return cache[key]


def direct_kinds(ctx) -> frozenset:
    """Communicator kinds whose flows may take every pair's own route: EP under DeepEP's kernels."""
    routing = getattr(ctx, "routing", None)
    return frozenset({"ep"}) if routing is not None and routing.a2a == "deepep" else frozenset()


def _contention_flags(graph, network, groups: list[tuple[str, list[str]]], direct: frozenset) -> list[bool]:
    link_sets = [flow_links(graph, network, r, k in direct) for k, r in groups]
    takers = [set(r[:1]) if k == "pp" else set(r) for k, r in groups]
    users: dict = {}
    for gid, links in enumerate(link_sets):
        for link in links:
            users.setdefault(link, []).append(gid)
    out = []
    for gid, links in enumerate(link_sets):
        others = {h for link in links for h in users[link] if h != gid}
        out.append(any(not (takers[gid] & takers[h]) for h in others))
    return out
