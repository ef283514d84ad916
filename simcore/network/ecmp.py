"""Shortest-path ECMP routing over a cluster graph, for :class:`simcore.network.flownet.FlowNetwork`.

A route is a shortest path in hops that never transits a GPU (GPUs are endpoints only, see
:mod:`simcore.network.cluster_graph`). Among equal-cost next hops, a CRC32 hash of (seed, src, dst,
flow_key, hop) picks one at every hop, like switch ECMP: deterministic for a seed, spread
over spines across flows. Given a per-link ``load``, the least-loaded option is taken instead
(adaptive routing; the hash breaks ties) and the route is not cached.

Performance: shortest paths come from a bidirectional BFS whose levels (from each source,
towards each destination) are cached and shared by every pair, so an all-to-all expands
each end once; routes are cached per (src, dst, flow_key).
"""

from __future__ import annotations

import math
import numbers
import zlib

import networkx as nx
import numpy as np

__all__ = ["EcmpRouter"]


class _Search:
    """Cached breadth-first levels from one end (``levels[k]``: nodes at distance k)."""

    __slots__ = ("end", "levels", "dist", "back")

    def __init__(self, end: str):
        self.end, self.levels, self.dist, self.back = end, [[end]], {end: 0}, {}


class EcmpRouter:
    """Links of a graph as indexed arrays, plus cached ECMP routes between its nodes.

    Parameters
    ----------
    graph : networkx.DiGraph
        Every edge carries ``bandwidth_bytes_per_s`` (> 0) and ``latency_s`` (>= 0).
    seed : int
        Seeds the ECMP hash.

    Attributes
    ----------
    links : list of (str, str)
        Directed links; a link id indexes this list, ``capacity`` and ``latency``.
    capacity : numpy.ndarray
        Bytes/s per link.
    latency : list of float
        Seconds per link.
    """

    def __init__(self, graph: nx.DiGraph, seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"FlowNetwork seed must be an int, got {seed!r}")
        self.seed = seed
        self.links: list[tuple[str, str]] = []
        capacity, self.latency = [], []
        for u, v, data in graph.edges(data=True):
            bw, lat = data.get("bandwidth_bytes_per_s"), data.get("latency_s")
            if not (isinstance(bw, numbers.Real) and 0 < bw < math.inf):
                raise ValueError(f"FlowNetwork: link ({u!r}, {v!r}) bandwidth_bytes_per_s must be positive, "
                                 f"got {bw!r}")
            if not (isinstance(lat, numbers.Real) and 0 <= lat < math.inf):
                raise ValueError(f"FlowNetwork: link ({u!r}, {v!r}) latency_s must be non-negative, "
                                 f"got {lat!r}")
            self.links.append((u, v))
            capacity.append(float(bw))
            self.latency.append(float(lat))
        self.capacity = np.array(capacity, dtype=float)
        self._link_id = {link: i for i, link in enumerate(self.links)}
        self._succ = {u: sorted(graph.successors(u), key=str) for u in graph}
        self._pred = {v: sorted(graph.predecessors(v), key=str) for v in graph}
        self._transit = {n: kind != "gpu" for n, kind in graph.nodes(data="kind")}
        self._meets: dict[tuple[str, str], tuple[int, int, set[str]]] = {}
        self._searches: dict[tuple[str, bool], _Search] = {}  # (end, forward) -> cached BFS levels
        self._routes: dict[tuple[str, str, int], tuple[np.ndarray, float]] = {}
        self._forks: dict[tuple[str, str], bool] = {}  # (src, dst) -> ECMP has a choice on the way

    def check_node(self, node: str) -> None:
        """Raise ``ValueError`` unless ``node`` is in the graph."""
        if node not in self._succ:
            raise ValueError(f"FlowNetwork: unknown node {node!r}")

    def route(self, src: str, dst: str, flow_key: int = 0,
              load: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """(link ids, latency in s) of the route of one flow from ``src`` to ``dst != src``: ECMP, or
        least ``load[link]`` among equal-cost next links when ``load`` is given (adaptive)."""
        key = (src, dst, flow_key)
        route = self._routes.get(key) if load is None else None
        if route is not None:
            return route
        best, bd, lead = self._shortest(src, dst)
        bdist, fdist = self._searches[(dst, False)].dist, self._searches[(src, True)].dist
        links, latency, u, forks = [], 0.0, src, False
        for i in range(1, best + 1):
            togo = best - i
            if togo == 0:
                v = dst
            else:
                if togo <= bd:  # the backward search knows every node this close to dst
                    options = [w for w in self._succ[u] if self._transit[w] and bdist.get(w) == togo]
                else:  # nearer src: nodes of the forward search that lead on to dst
                    options = [w for w in self._succ[u] if w in lead and fdist[w] == i]
                if len(options) > 1:
                    forks = True
                    digest = zlib.crc32(f"{self.seed}|{src}|{dst}|{flow_key}|{u}".encode())
                    if load is not None:  # least loaded; the hash's pick first among equals
                        options = options[digest % len(options):] + options[:digest % len(options)]
                        digest = min(range(len(options)), key=lambda j: load[self._link_id[(u, options[j])]])
                    v = options[digest % len(options)]
                else:
                    v = options[0]
            link = self._link_id[(u, v)]
            links.append(link)
            latency += self.latency[link]
            u = v
        route = (np.array(links, dtype=np.intp), latency)
        self._forks[(src, dst)] = forks
        if load is None:
            self._routes[key] = route
        return route

    def forks(self, src: str, dst: str) -> bool:
        """Whether shortest paths from ``src`` to ``dst != src`` branch (more than one route exists, so
        which one a flow takes depends on its ECMP hash of the pair and flow key, or on the load)."""
        if (src, dst) not in self._forks:
            self.route(src, dst)
        return self._forks[(src, dst)]

    def _shortest(self, src: str, dst: str) -> tuple[int, int, set[str]]:
        """Hop distance ``best`` from src to dst, by bidirectional BFS over cached levels.

        Both searches advance whole levels, the smaller frontier first, until they meet
        (traffic never transits a GPU). Returns ``best``, the backward depth ``bd`` reached
        (distances to dst up to ``bd`` are exact) and ``lead``: the forward-search nodes
        closer to src than that which lie on some shortest path. The BFS levels from each
        source and towards each destination are shared by all pairs, so an all-to-all
        expands each end once; cost follows the neighbourhoods of the two ends.
        """
        found = self._meets.get((src, dst))
        if found is not None:
            return found
        self.check_node(src)
        self.check_node(dst)
        fwd = self._searches.get((src, True)) or self._searches.setdefault((src, True), _Search(src))
        bwd = self._searches.get((dst, False)) or self._searches.setdefault((dst, False), _Search(dst))
        fd = bd = 0
        best = None
        while best is None:
            if len(fwd.levels[fd]) <= len(bwd.levels[bd]):
                fd += 1
                front = self._level(fwd, fd, self._succ)
                meets = [v for v in front if bwd.dist.get(v, bd + 1) <= bd and (self._transit[v] or v == dst)]
            else:
                bd += 1
                front = self._level(bwd, bd, self._pred)
                meets = [u for u in front if fwd.dist.get(u, fd + 1) <= fd and (self._transit[u] or u == src)]
            if not front:
                raise ValueError(f"FlowNetwork: no route from {src!r} to {dst!r} "
                                 "(traffic never transits a GPU)")
            if meets:
                best = min(fwd.dist[v] + bwd.dist[v] for v in meets)
        first = best - bd  # positions >= first are judged by the backward distances
        lead: set[str] = set()
        if first > 1:
            stack = [v for v in fwd.levels[first] if bwd.dist.get(v) == bd and (self._transit[v] or v == dst)]
            while stack:
                for u in fwd.back.get(stack.pop(), ()):
                    if u != src and u not in lead:
                        lead.add(u)
                        stack.append(u)
        found = self._meets[(src, dst)] = (best, bd, lead)
        return found

    def _level(self, search: _Search, depth: int, adjacency: dict[str, list[str]]) -> list[str]:
        """BFS level ``depth`` of ``search``, expanding (and caching) levels as needed.

        ``search.back[v]`` collects the previous-level nodes adjacent to ``v``. A GPU other
        than the search's own end is recorded but never expanded: it is no transit hop.
        """
        levels, dist, back = search.levels, search.dist, search.back
        while len(levels) <= depth:
            nxt: list[str] = []
            for u in levels[-1]:
                if u != search.end and not self._transit[u]:
                    continue
                for v in adjacency[u]:
                    seen = dist.get(v)
                    if seen is None:
                        dist[v], back[v] = len(levels), [u]
                        nxt.append(v)
                    elif seen == len(levels):
                        back[v].append(u)
            levels.append(nxt)
            if not nxt:
                break
        return levels[depth] if depth < len(levels) else []
