"""Flow-level network on SimPy: shortest-path ECMP routing and max-min fair link sharing.

A flow first waits its path latency (sum of the links' ``latency_s``), then drains its bytes
at its max-min fair rate (:func:`simcore.network.maxmin.max_min_rates`, also capped by the flow's
own ``rate_cap_bytes_per_s``). Rates change only when the set of draining flows changes, so
the network re-solves rates on each arrival/departure and keeps one SimPy timeout for the
earliest completion; a version counter makes superseded timeouts no-ops.

Performance design (see ``python -m validation.bench.network``):

- Flows live in *batches*: the flows of one :meth:`FlowNetwork.transfer_group` that share a
  path latency start together with the same size, so they are stored as numpy arrays
  (remaining bytes per flow, (flow, link) entries) rather than Python objects. This is
  exact: every flow keeps its own rate and remaining bytes, and flows whose rates are
  equal by symmetry (a ring step, an all-to-all class) finish in the same event. A
  single :meth:`~FlowNetwork.transfer` is a batch of one; the test suite checks that
  a group and the same flows sent one by one give identical results.
- Arrivals due at the same instant share one SimPy timeout, and the rate solve runs once
  per instant after every other event of that instant (:class:`_LateEvent`), however many
  flows arrived or finished then.
- Group plans are cached per pair list; routes (:class:`simcore.network.ecmp.EcmpRouter`: shortest
  path in hops never transiting a GPU, ECMP by a hash of seed, src, dst, flow_key and hop)
  per (src, dst, flow_key). With ``routing="adaptive"`` every flow instead takes, at each hop
  with several equal-cost next links, the one carrying the fewest unfinished flows per byte/s
  of capacity (least-loaded uplink, decided when the flow is sent; not cached).
- Rate solves warm-start from the previous rates (:func:`simcore.network.maxmin.max_min_rates`):
  after a completion only the flows that lost their bottleneck are re-solved.
- Flows of one call with identical routes (16 ring channels over one NVSwitch) are one member
  of that weight (weighted max-min, exact: identical flows get identical rates).

Capacity is derated on the link, not per flow: ``link_efficiency(u, v, data)`` (default 1)
scales each link's ``bandwidth_bytes_per_s`` to what traffic can actually carry on it (NVLink's
and InfiniBand's protocol overheads), so k identical link-bound transfers take k times one.

A *chain* (:meth:`FlowNetwork.transfer_chains`) is one flow that crosses the routes of several
legs at once: a pipelined NCCL ring or tree channel moves the same bytes over every edge at one
rate, the rate of its slowest link (finite FIFO slots couple the edges), so it is one max-min flow
over the union of its legs' links.

SimPy cannot cancel a scheduled timeout, so a superseded completion timer still fires (as
a no-op) and ``env.run()`` without ``until`` may end after the last flow finished: read
completion times from the returned events (their value is the completion time, seconds).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Hashable, Sequence
from functools import partial

import networkx as nx
import numpy as np
import simpy

from simcore.network.chainset import ChainSet, check_transfer
from simcore.network.ecmp import EcmpRouter
from simcore.network.maxmin import max_min_rates

__all__ = ["FlowNetwork", "ROUTINGS"]

#: Routing policies of :class:`FlowNetwork`.
ROUTINGS = ("ecmp", "adaptive")

_LATE_PRIORITY = 2  # after simpy's URGENT (0) and NORMAL (1) events of the same instant
_DONE_RTOL = 1e-9  # a flow within this fraction of its size of the end counts as finished


class _LateEvent(simpy.Event):
    """An already-triggered event processed after all normal events of the current instant.

    Built like :class:`simpy.Timeout` (which also sets ``_ok``/``_value`` itself) but with a
    lower priority, so one rate solve covers every arrival and completion of that instant.
    """

    def __init__(self, env: simpy.Environment):
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, _LATE_PRIORITY)


class _Transfer:
    """The user-visible event of one transfer call and how many of its batches are unfinished."""

    __slots__ = ("done", "pending")

    def __init__(self, done: simpy.Event, pending: int):
        self.done, self.pending = done, pending


class _Batch:
    """Flows that start draining together with one size and rate cap, as arrays.

    ``links[e]`` is crossed by member ``member[e]``; ``rem`` holds remaining bytes per member and
    ``rate`` its rate; a member of weight w stands for w identical flows (:mod:`simcore.network.maxmin`).
    """

    __slots__ = ("links", "member", "weight", "rem", "rate", "size", "cap", "k", "k0", "owner", "tag")

    def __init__(self, entry: tuple, size: float, cap: float, owner: _Transfer, tag: Hashable | None):
        """``entry`` is a plan entry from :func:`_entries`: its arrays are shared (never written in place),
        its remaining bytes and unknown rates are copied from templates (cheaper than filling)."""
        _, self.links, self.member, self.weight, self.k0, rem, unknown = entry
        self.k = len(self.weight)
        self.rem = rem.copy()
        self.rate = unknown.copy()  # unknown (nan) until the next solve
        self.size, self.cap, self.owner, self.tag = float(size), float(cap), owner, tag

    def drop(self, finished: np.ndarray) -> bool:
        """Remove finished members; True when none is left."""
        keep = ~finished
        k = int(keep.sum())
        if k:
            renumber = np.cumsum(keep) - 1
            kept_entries = keep[self.member]
            self.links, self.member = self.links[kept_entries], renumber[self.member[kept_entries]]
            self.rem, self.rate, self.weight = self.rem[keep], self.rate[keep], self.weight[keep]
        self.k = k
        return k == 0


class FlowNetwork:
    """Flow-level model of a cluster graph inside a SimPy environment.

    Parameters
    ----------
    env : simpy.Environment
        The simulation clock (seconds).
    graph : networkx.DiGraph
        Every edge carries ``bandwidth_bytes_per_s`` (> 0) and ``latency_s`` (>= 0); nodes of
        ``kind == "gpu"`` are endpoints only (see :mod:`simcore.network.cluster_graph`).
    seed : int
        Seeds the ECMP hash; the same seed gives the same routes and results.
    record : bool
        Keep a utilization timeline per link and a flow start/end log (``flow_log``).
    link_efficiency : callable, optional
        ``(u, v, edge_data) -> factor in (0, 1]``: the fraction of a link's bandwidth traffic
        can use (default 1 everywhere). See :meth:`set_link_efficiency`.
    routing : str
        ``ecmp`` (seeded hash per flow key) or ``adaptive`` (least-loaded next link per flow).

    Attributes
    ----------
    events_processed : int
        Rate solves plus completion timeouts handled.
    flow_log : list of tuple
        With ``record``: ``(time_s, "start" | "end", tag, num_flows)`` per batch (the flows
        of one call that share a path latency).
    """

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph, seed: int = 0, record: bool = False,
                 link_efficiency: Callable[[str, str, dict], float] | None = None, routing: str = "ecmp"):
        if routing not in ROUTINGS:
            raise ValueError(f"FlowNetwork routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        self.router = EcmpRouter(graph, seed)
        self.env, self.graph, self.seed, self.record = env, graph, seed, bool(record)
        self.routing = routing
        self._adaptive = routing == "adaptive"
        self._links, self._capacity = self.router.links, self.router.capacity.copy()
        self.link_efficiency: Callable[[str, str, dict], float] | None = None
        self._plans: dict[tuple, list[tuple[float, np.ndarray, np.ndarray, int]]] = {}
        num_links = len(self._links)
        self._batches: list[_Batch] = []  # the batches of the current rate solution
        self._arrived: list[_Batch] = []  # started draining since the last solve
        self._arrivals: dict[float, list[_Batch]] = {}  # waiting out their latency, by start time
        self._rem = self._rate = self._finish = self._tol = np.empty(0)
        self._bounds = np.zeros(1, dtype=np.intp)
        self._load, self._link_bytes = np.zeros(num_links), np.zeros(num_links)
        self._util = np.zeros(num_links)
        self._timeline: dict[int, list[tuple[float, float]]] = {}
        self._t_last = env.now
        self._stale = False  # flat arrays out of date (between a completion and the solve)
        self._solve_pending = False
        self._timer_version, self._timer_at = 0, None
        self.events_processed = 0
        self.flow_log: list[tuple[float, str, Hashable | None, int]] = []
        self._flows_on = np.zeros(num_links)  # unfinished flows per link (adaptive routing's load)
        if link_efficiency is not None:
            self.set_link_efficiency(link_efficiency)

    def set_link_efficiency(self, link_efficiency: Callable[[str, str, dict], float]) -> None:
        """Derate every link: capacity = ``bandwidth_bytes_per_s x link_efficiency(u, v, data)``.

        Only while no flow is in flight; ``ValueError`` for a factor outside (0, 1].
        """
        if self._batches or self._arrived or self._arrivals:
            raise RuntimeError("FlowNetwork.set_link_efficiency: flows are in flight")
        factors = np.array([link_efficiency(u, v, self.graph.edges[u, v]) for u, v in self._links], dtype=float)
        bad = np.flatnonzero(~((factors > 0) & (factors <= 1)))
        if bad.size:
            u, v = self._links[int(bad[0])]
            raise ValueError(f"FlowNetwork: link ({u!r}, {v!r}) efficiency must be in (0, 1], "
                             f"got {factors[bad[0]]!r}")
        self._capacity = self.router.capacity * factors
        self.link_efficiency = link_efficiency

    @property
    def capacity(self) -> dict[tuple[str, str], float]:
        """Usable bytes/s of every directed link (bandwidth x efficiency)."""
        return dict(zip(self._links, self._capacity.tolist(), strict=True))

    # ----------------------------------------------------------------- routing
    def path(self, src: str, dst: str, flow_key: int = 0) -> list[tuple[str, str]]:
        """Directed links of the route from ``src`` to ``dst`` (empty when equal)."""
        if src == dst:
            self.router.check_node(src)
            return []
        return [self._links[i] for i in self.router.route(src, dst, flow_key)[0].tolist()]

    def forks(self, src: str, dst: str) -> bool:
        """Whether more than one shortest route joins ``src`` to ``dst`` (ECMP chooses per flow)."""
        return src != dst and self.router.forks(src, dst)

    def path_latency(self, src: str, dst: str, flow_key: int = 0) -> float:
        """Sum of ``latency_s`` along the route, seconds."""
        return 0.0 if src == dst else self.router.route(src, dst, flow_key)[1]

    # --------------------------------------------------------------- transfers
    def transfer(self, src: str, dst: str, size_bytes: float, rate_cap_bytes_per_s: float = math.inf,
                 flow_key: int = 0, tag: Hashable | None = None) -> simpy.Event:
        """One flow of ``size_bytes`` from ``src`` to ``dst``.

        Returns an event that fires (value: completion time, s) when the last byte arrives:
        path latency + draining at the max-min fair rate, capped by ``rate_cap_bytes_per_s``.
        ``src == dst`` or ``size_bytes == 0`` completes after 0 s.
        """
        check_transfer(size_bytes, rate_cap_bytes_per_s)
        done = self.env.event()
        if src == dst or size_bytes == 0:
            self.router.check_node(src)
            self.router.check_node(dst)
            return done.succeed(self.env.now)
        links, latency = self.router.route(src, dst, flow_key,
                                           self._link_load() if self._adaptive else None)
        entry = _entries([(latency, links, np.zeros(len(links), dtype=np.intp), np.ones(1))], size_bytes)[0]
        self._launch(_Batch(entry, size_bytes, rate_cap_bytes_per_s, _Transfer(done, 1), tag), latency)
        return done

    def transfer_group(self, pairs: Sequence[tuple[str, str]], size_bytes: float,
                       rate_cap_bytes_per_s: float = math.inf, tag: Hashable | None = None,
                       flow_key: int = 0) -> simpy.Event:
        """Flows of ``size_bytes`` for every ``(src, dst)`` pair, started together.

        The event fires (value: completion time, s) when every flow has finished. Results
        equal one :meth:`transfer` per pair; flows sharing a path latency are simulated as
        one array batch (module docstring).
        """
        check_transfer(size_bytes, rate_cap_bytes_per_s)
        pairs = tuple(map(tuple, pairs))
        plan = None if self._adaptive else self._plans.get((pairs, flow_key))
        if plan is None:  # a pair is a chain of one leg
            plan = self._plan(tuple((p,) for p in pairs), (flow_key,) * len(pairs), (pairs, flow_key))
        return self._start(_entries(plan, size_bytes), size_bytes, rate_cap_bytes_per_s, tag)

    def transfer_chains(self, chains: Sequence[Sequence[tuple[str, str]]], size_bytes: float,
                        rate_cap_bytes_per_s: float = math.inf, tag: Hashable | None = None,
                        flow_keys: Sequence[int] | None = None) -> simpy.Event:
        """One flow of ``size_bytes`` per chain, each crossing every link of its legs' routes.

        A chain is a sequence of ``(src, dst)`` legs moved at one common rate (a pipelined ring or
        tree channel); its latency is its longest leg's. ``flow_keys`` (default 0) seeds each
        chain's ECMP hash, one per chain. The event fires (value: completion time, s) when every
        chain has finished; a chain whose legs all have ``src == dst`` costs nothing.
        """
        return self.send(ChainSet(chains, size_bytes, rate_cap_bytes_per_s, flow_keys), tag)

    def send(self, chain_set: ChainSet, tag: Hashable | None = None) -> simpy.Event:
        """:meth:`transfer_chains` of a prepared :class:`~simcore.network.chainset.ChainSet`: the same plan and
        flows, without normalizing, checking and hashing its chains again (the network's plan is kept on
        the chain set the first time; with adaptive routing every send plans anew, as the call does)."""
        if self._adaptive:
            plan = self._plan(chain_set.chains, chain_set.keys, None)
            return self._start(_entries(plan, chain_set.size), chain_set.size, chain_set.cap, tag)
        entries = chain_set.planned_for(self)
        if entries is None:
            key = (chain_set.chains, chain_set.keys)
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plan(chain_set.chains, chain_set.keys, key)
            entries = chain_set.batches = _entries(plan, chain_set.size)
            chain_set.network = weakref.ref(self)
        return self._start(entries, chain_set.size, chain_set.cap, tag)

    def _start(self, entries: list[tuple], size_bytes: float, cap: float, tag: Hashable | None) -> simpy.Event:
        done = self.env.event()
        if size_bytes == 0 or not entries:
            return done.succeed(self.env.now)
        owner = _Transfer(done, len(entries))
        for entry in entries:
            self._launch(_Batch(entry, size_bytes, cap, owner, tag), entry[0])
        return done

    def _plan(self, chains: tuple, keys: tuple, cache_key: tuple) -> list[tuple[float, np.ndarray, np.ndarray, int]]:
        """Routes of chains bucketed by latency, as batch arrays (cached unless routing adapts)."""
        adaptive = self._adaptive
        buckets: dict[float, list[np.ndarray]] = {}
        for chain, key in zip(chains, keys, strict=True):
            routes, latency = [], 0.0
            for src, dst in chain:
                if src == dst:
                    self.router.check_node(src)
                    continue
                links, lat = self.router.route(src, dst, key, self._link_load() if adaptive else None)
                if adaptive:  # the next flows of this call see this one's load
                    np.add.at(self._flows_on, links, 1.0)
                routes.append(links)
                latency = max(latency, lat)
            if routes:
                buckets.setdefault(latency, []).append(np.concatenate(routes))
        plan = []
        for latency, routes in buckets.items():
            merged: dict[bytes, int] = {}  # identical routes: one member of that weight (exact)
            for links in routes:
                merged[links.tobytes()] = merged.get(links.tobytes(), 0) + 1
            routes = [np.frombuffer(key, dtype=np.intp) for key in merged]
            weight = np.array(list(merged.values()), dtype=float)
            member = np.repeat(np.arange(len(routes)), [len(r) for r in routes])
            plan.append((latency, np.concatenate(routes), member, weight))
            if adaptive:  # _launch counts them again
                np.add.at(self._flows_on, plan[-1][1], -weight[member])
        if not adaptive:
            self._plans[cache_key] = plan
        return plan

    def _link_load(self) -> np.ndarray:
        """Unfinished flows per byte/s of capacity, per link (what adaptive routing minimizes)."""
        return self._flows_on / self._capacity

    def _launch(self, batch: _Batch, latency: float) -> None:
        if self._adaptive:
            np.add.at(self._flows_on, batch.links, batch.weight[batch.member])
        if latency <= 0:
            self._activate([batch])
            return
        start = self.env.now + latency
        waiting = self._arrivals.get(start)
        if waiting is None:  # one timeout per distinct start instant
            waiting = self._arrivals[start] = []
            self.env.timeout(latency).callbacks.append(partial(self._on_arrival, start))
        waiting.append(batch)

    def _on_arrival(self, start: float, _event: simpy.Event) -> None:
        self._activate(self._arrivals.pop(start))

    def _activate(self, batches: list[_Batch]) -> None:
        self._advance()
        self._arrived.extend(batches)
        if self.record:
            self.flow_log.extend((self.env.now, "start", b.tag, b.k0) for b in batches)
        if not self._solve_pending:
            self._solve_pending = True
            _LateEvent(self.env).callbacks.append(self._solve)

    # ------------------------------------------------------------ rate engine
    def _advance(self) -> None:
        """Drain every flow at its current rate up to now."""
        dt = self.env.now - self._t_last
        if dt > 0:
            if self._stale:
                raise RuntimeError("FlowNetwork: time advanced between a completion and its rate solve")
            self._rem -= self._rate * dt  # in place: the batches hold views of this array
            self._link_bytes += self._load * dt
        self._t_last = self.env.now

    def _solve(self, _event: simpy.Event | None = None) -> None:
        """Re-solve max-min rates for the current flows and arm the completion timer."""
        self._solve_pending = False
        self.events_processed += 1
        self._advance()
        batches = self._batches = self._batches + self._arrived
        self._arrived = []
        self._stale = False
        if not batches:
            self._rem = self._rate = self._finish = self._tol = np.empty(0)
            self._bounds = np.zeros(1, dtype=np.intp)
            self._set_load(np.zeros(len(self._links)))
            return
        bounds, rem, links, flows, caps, guess, weight, tol = _flatten(batches)
        unit = bool((weight == 1.0).all())
        rate = max_min_rates(flows, links, self._capacity, caps, guess=guess, weight=None if unit else weight)
        for b, lo, hi in zip(batches, bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            b.rem, b.rate = rem[lo:hi], rate[lo:hi]
        total = rate if unit else rate * weight
        self._set_load(np.bincount(links, weights=total[flows], minlength=len(self._links)))
        self._rem, self._rate, self._bounds, self._tol = rem, rate, bounds, tol
        self._finish = self.env.now + rem / rate
        self._arm(float(self._finish.min()))

    def _arm(self, when: float) -> None:
        if self._timer_at is not None and self._timer_at <= when:
            return  # the pending timer fires first and re-arms
        self._timer_version += 1
        self._timer_at = when
        delay = max(when - self.env.now, 0.0)
        self.env.timeout(delay).callbacks.append(partial(self._on_timer, self._timer_version))

    def _on_timer(self, version: int, _event: simpy.Event) -> None:
        if version != self._timer_version:
            return  # superseded by a later solve
        self._timer_at = None
        self.events_processed += 1
        self._advance()
        now = self.env.now
        finished = (self._finish <= now + 1e-12 * abs(now) + 1e-18) | (self._rem <= self._tol)
        if not finished.any():
            self._arm(float(self._finish.min()))
            return
        which = np.searchsorted(self._bounds, np.flatnonzero(finished), side="right") - 1
        survivors = []
        hit = set(which.tolist())
        for j, b in enumerate(self._batches):
            gone = finished[self._bounds[j]:self._bounds[j + 1]] if j in hit else None
            if gone is not None and self._adaptive:
                np.add.at(self._flows_on, b.links[gone[b.member]], -b.weight[b.member][gone[b.member]])
            if gone is not None and b.drop(gone):
                self._finish_batch(b)
            else:
                survivors.append(b)
        self._batches = survivors
        self._stale = True
        self._activate([])

    def _finish_batch(self, batch: _Batch) -> None:
        if self.record:
            self.flow_log.append((self.env.now, "end", batch.tag, batch.k0))
        owner = batch.owner
        owner.pending -= 1
        if owner.pending == 0:
            owner.done.succeed(self.env.now)

    def _set_load(self, load: np.ndarray) -> None:
        if self.record:
            util = load / self._capacity
            now = self.env.now
            for i in np.flatnonzero(util != self._util).tolist():
                series = self._timeline.setdefault(i, [])
                if series and series[-1][0] == now:
                    series[-1] = (now, float(util[i]))
                else:
                    series.append((now, float(util[i])))
            self._util = util
        self._load = load

    # ----------------------------------------------------------------- reports
    @property
    def link_bytes(self) -> dict[tuple[str, str], float]:
        """Bytes carried so far per directed link (links that carried any)."""
        self._advance()
        return {self._links[i]: float(self._link_bytes[i]) for i in np.flatnonzero(self._link_bytes).tolist()}

    @property
    def active_flows(self) -> int:
        """Flows currently draining (latency already paid)."""
        return int(sum(b.weight.sum() for b in self._batches) + sum(b.weight.sum() for b in self._arrived))

    def utilization(self) -> dict[tuple[str, str], list[tuple[float, float]]]:
        """Per used link, the piecewise-constant ``(time_s, load / capacity)`` timeline."""
        if not self.record:
            raise RuntimeError("FlowNetwork.utilization needs record=True")
        return {self._links[i]: list(series) for i, series in self._timeline.items()}


def _flatten(batches: list[_Batch]) -> tuple[np.ndarray, ...]:
    """The batches' flows as flat arrays for a solve: member bounds, remaining bytes, (flow, link) entries
    with global flow ids, caps, warm-start rates, weights and done tolerances. Remaining bytes are a new
    array (the batches then view it, :meth:`FlowNetwork._advance` drains it in place); the others are
    only read. A lone batch (one collective in flight, the common case) uses its own arrays: the same
    values the concatenation would copy (its ids need no offset), without ~10 numpy calls."""
    if len(batches) == 1:
        b = batches[0]
        k = b.k
        return (np.array((0, k), dtype=np.intp), b.rem.copy(), b.links, b.member, np.full(k, b.cap), b.rate,
                b.weight, np.full(k, b.size * _DONE_RTOL))
    sizes = [b.k for b in batches]
    bounds = np.zeros(len(batches) + 1, dtype=np.intp)
    np.cumsum(sizes, out=bounds[1:])
    flows = np.concatenate([b.member for b in batches])
    flows += np.repeat(bounds[:-1], [len(b.links) for b in batches])  # batch-local -> global ids
    return (bounds, np.concatenate([b.rem for b in batches]), np.concatenate([b.links for b in batches]), flows,
            np.repeat([b.cap for b in batches], sizes),
            np.concatenate([b.rate for b in batches]),  # warm start: only changed flows re-solve
            np.concatenate([b.weight for b in batches]), np.repeat([b.size * _DONE_RTOL for b in batches], sizes))


def _entries(plan: list[tuple], size_bytes: float) -> list[tuple]:
    """Plan entries ``(latency, links, member, weight)`` with what each batch starts from: its flow
    count, remaining bytes (``size_bytes`` each) and unknown rates (nan), as :class:`_Batch` copies them."""
    return [(latency, links, member, weight, int(weight.sum()), np.full(len(weight), float(size_bytes)),
             np.full(len(weight), np.nan)) for latency, links, member, weight in plan]
