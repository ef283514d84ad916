"""The per-GPU engine: every lane (a GPU, or an orbit of GPUs proven identical, :mod:`.lanes`) has its
own compute and communication streams and its own program, and every communicator's collective
starts when the last of its members reaches it (a rendezvous), so nothing waits for GPUs it does
not talk to. All communicators put their flows on the one network.

A collective whose links no other communicator can use at the same time (one that shares a link
with it but no participating GPU) takes the idle-fabric cost of its own communicator
(:func:`simcore.engine.pricing.idle_cost_s`) without the flow solver; every other one runs as
flows. An MoE dispatch or combine whose pairs move different byte counts (skewed routing) is an
all-to-all-v (:mod:`.alltoallv`), always as flows, and ends with its slowest pair. Under
``sim.routing.a2a=deepep`` it is DeepEP's kernels instead (:mod:`.deepep`): DeepEP's time for the
drawn pairs (its slowest rank's) where it contends with nothing, else DeepEP's traffic as flows.
"""

from __future__ import annotations

import numpy as np
import simpy

from simcore.collectives.flows import collective_channels, compile_collective, run_compiled
from simcore.engine.alltoallv import run_alltoallv
from simcore.engine.contention import contention_flags, direct_kinds
from simcore.engine.lanes import lane_membership
from simcore.engine.pricing import group_shape, idle_cost_s, packed_shape
from simcore.hardware.gpus import get_gpu
from simcore.moe.deepep_exchange import Exchange, deepep_mode, exchange, run_exchange, token_bytes

__all__ = ["LaneComm"]

_KINDS = ("tp", "ep", "pp")
_LATE = 3  # after simpy's URGENT (0) and NORMAL (1) events and the network's rate solves (2)


class LaneComm:
    """Communicators of every stage, which lanes take part in each, and their rendezvous."""

    def __init__(self, env, ctx, graph, placement, lanes, network, work, analytic_only: bool = False,
                 record: bool = False):
        self.env, self.ctx, self.graph, self.network, self.work = env, ctx, graph, network, work
        self.analytic_only = analytic_only or network is None
        self.kwargs = {} if ctx.collective_constants is None else {"constants": ctx.collective_constants}
        s = placement.s
        (self.groups, self.participants, self.takers, self.sm_share,
         self.lane_groups) = lane_membership(placement, lanes)
        self.shapes = [group_shape(graph, r) for _, r in self.groups]
        self.contended = (contention_flags(graph, network, self.groups, direct_kinds(ctx)) if not self.analytic_only
                          else [False] * len(self.groups))
        self.packed = {kind: packed_shape(ctx, s, kind) for kind in _KINDS}
        #: SMs per GPU, of which a running collective holds :meth:`kernel_sms` (the executor's SM
        #: sharing, as :class:`~simcore.engine.comm.FlowComm`; none with contention off, as AnalyticComm)
        self.num_sms = 0 if self.analytic_only else get_gpu(graph.graph["gpu"]).num_sms
        self._pending: dict[tuple, list] = {}
        # Collectives whose members all arrived wait here until every participating lane's
        # communication stream is free, then take them all at once (no lane holds its stream while
        # waiting for others: that could deadlock two microbatches issued in opposite orders).
        self._queue: list[tuple] = []
        self._busy: set[str] = set()
        self._releasing: set[str] = set()
        self._queued = False  # arrivals queued since the last grant pass
        self._takers_cache: dict[tuple[int, ...], frozenset] = {}
        self._costs: dict[tuple, float | None] = {}
        # memos of what every repeat of an op recomputes identically (a decode step repeats its ops)
        self._sms: dict[tuple, int] = {}
        self._group_costs: dict[tuple, tuple] = {}
        self._held: dict[tuple, dict[int, float]] = {}
        self._pairs: dict[tuple, tuple[np.ndarray | None, bool]] = {}
        self._compiled: dict[tuple, tuple] = {}
        self._exchanges: dict[tuple, Exchange | None] = {}
        # (lane, kind) whose every communicator has no other participating lane
        self._solo = {key: all(self.participants[g] == {key[0]} for g in gids)
                      for key, gids in self.lane_groups.items()}
        self._release_pending = False
        self._seq = 0
        self.executor = None  # set by LaneExecutor: SMs held while a collective runs
        self.flows_run = 0
        self.record = record
        self.analytic_log: list[tuple[list[str], str, float, float, float]] = []  # for link counters

    def kernel_sms_of(self, gid: int, op) -> int:
        """SMs the op's NCCL kernel holds on each GPU of the group while it runs (one per channel).
        Memoized on every op field it reads (asked at every launch; the channel lookup hashes the
        constants and fabric field by field)."""
        if op.size_bytes <= 0:
            return 0
        key = (gid, op.name, op.layer, op.collective, op.size_bytes, op.algorithm)
        sms = self._sms.get(key)
        if sms is None:
            ex = self._deepep(gid, op, 0)
            sms = self._sms[key] = ex.sms if ex is not None else collective_channels(  # DeepEP: its own SMs
                self.network, op.collective, op.size_bytes, self.groups[gid][1], fabric=self.ctx.cluster.fabric,
                **self.kwargs)
        return sms

    # ----- rendezvous -------------------------------------------------------------------------
    def run(self, env: simpy.Environment, lane: int, op, microbatch: int, step: int):
        # a dispatch or combine with nothing for this rank still meets its EP group (others may send)
        if op.size_bytes <= 0 and not (op.group == "ep" and self.work is not None):
            return
        gids = self.lane_groups.get((lane, op.group), [])
        if not gids:
            return None
        if self._solo.get((lane, op.group)):  # no other lane takes part: no rendezvous to wait for
            self._seq += 1
            done = [env.event()]
            self._queue.append((step * 10_000 + microbatch, self._seq, tuple(gids), op, step, done[0]))
            self._queued = True
        else:
            done = [self._arrive(gid, lane, op, microbatch, step) for gid in gids]
        if self._queued:  # one grant pass for everything this lane's arrival completed
            self._queued = False
            self._dispatch()
        yield env.all_of(done)
        return min(ev.value for ev in done)  # when the first of its collectives launched

    def _arrive(self, gid: int, lane: int, op, microbatch: int, step: int) -> simpy.Event:
        key = (gid, op.name, op.layer, microbatch, step)
        entry = self._pending.get(key)
        if entry is None:
            entry = self._pending[key] = [set(self.participants[gid]), self.env.event()]
        entry[0].discard(lane)
        if not entry[0]:
            del self._pending[key]
            self._seq += 1
            self._queue.append((step * 10_000 + microbatch, self._seq, (gid,), op, step, entry[1]))
            self._queued = True
        return entry[1]

    def _takers_of(self, gids: tuple[int, ...]) -> frozenset:
        out = self._takers_cache.get(gids)
        if out is None:
            out = self._takers_cache[gids] = frozenset().union(*(self.takers[g] for g in gids))
        return out

    def _dispatch(self) -> None:
        """Start every queued collective whose GPUs are all free, earliest (step, microbatch) first
        (the priority the executor's streams use). Collectives of one op that take the same
        idle-fabric cost start as one timeout (a lane standing for many GPUs runs many at once)."""
        self._queue.sort(key=lambda q: q[:2])
        waiting, batches = [], {}
        for item in self._queue:
            prio, _, gids, op, step, done = item
            gpus = self._takers_of(gids)
            if gpus & self._busy:
                waiting.append(item)
                continue
            self._busy |= gpus
            costs = self._idle_costs(gids, op, step)
            if len(gids) == 1 and costs[0] is not None:
                batch = batches.setdefault((prio, op.name, op.layer, costs[0]), ([], op, step, [], []))
                batch[0].append(gids[0])
                batch[3].append(done)
                batch[4].append(costs[0])
            else:
                self.env.process(self._launch(list(gids), op, step, [done], costs))
        for gids, op, step, dones, costs in batches.values():
            self.env.process(self._launch(gids, op, step, dones, costs))
        self._queue = waiting

    def _launch(self, gids: list[int], op, step: int, dones: list, costs: list):
        """Run collectives ``gids`` of ``op``: as flows where the cost is None, else that idle cost."""
        # a lane standing for several GPUs holds, per GPU, the SMs of the collectives its GPUs run
        sms = self.kernel_sms_of(gids[0], op) if self.executor is not None and self.num_sms else 0
        held = self._held_sms(gids, sms)
        start = self.env.now
        for lane, n in held.items():
            self.executor._hold_sms(lane, n)
        waits = [self.env.process(self._flows(g, op, step)) for g, c in zip(gids, costs, strict=True) if c is None]
        idle = max((c for c in costs if c is not None), default=0.0)
        if self.record:
            for g, c in zip(gids, costs, strict=True):
                if c:
                    self.analytic_log.append((self.groups[g][1], op.collective, self._size(g, op, step), start,
                                              start + c))
        if idle > 0:
            waits.append(self.env.timeout(idle))
        if waits:
            yield self.env.all_of(waits)
        for lane, n in held.items():
            self.executor._hold_sms(lane, -n)
        for done in dones:
            done.succeed(start)
        self._release_late(self._takers_of(tuple(gids)))

    def _held_sms(self, gids: list[int], sms: int) -> dict[int, float]:
        """Per lane, the SMs ``gids``' kernels hold (``sms`` per GPU taking part); memoized, same sums."""
        key = (tuple(gids), sms)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = {}
            for gid in gids if sms else ():
                for lane, share in self.sm_share[gid].items():
                    held[lane] = held.get(lane, 0.0) + sms * share
        return held

    def _release_late(self, gpus: frozenset) -> None:
        """Free the GPUs' streams after every other event of this instant (all collectives that end
        in it at once), then grant queued collectives by priority: by then the members have issued
        their next requests, as a SimPy stream's holder does before its release is granted, so a
        microbatch with two collectives in a row keeps its priority over one that was waiting."""
        self._releasing |= gpus
        if self._release_pending:
            return
        self._release_pending = True
        event = simpy.Event(self.env)
        event._ok, event._value = True, None  # already triggered, like simpy.Timeout; processed late
        event.callbacks.append(self._release)
        self.env.schedule(event, _LATE)

    def _release(self, _event) -> None:
        self._busy -= self._releasing
        self._releasing, self._release_pending = set(), False
        self._dispatch()

    def _a2a_pairs(self, gid: int, op, step: int) -> np.ndarray | None:
        return self._pairs_of(gid, op, step)[0]

    def _skewed(self, gid: int, op, step: int) -> bool:
        """Whether this EP all-to-all's pairs move different byte counts (an all-to-all-v)."""
        return self._pairs_of(gid, op, step)[1]

    def _pairs_of(self, gid: int, op, step: int) -> tuple[np.ndarray | None, bool]:
        """``(pair bytes or None, skewed)``, memoized: the pairs depend on the op and the draw of its layer
        and step only (the same for every EP communicator); read-only to callers."""
        if self.groups[gid][0] != "ep" or op.collective != "all_to_all":
            return None, False
        key = (op.name, op.layer, step if self.work is not None and self.work.step_dependent else 0)
        out = self._pairs.get(key)
        if out is None:
            pairs = self._pair_bytes(gid, op, step)
            out = self._pairs[key] = (pairs, pairs is not None and not np.all(pairs == pairs.flat[0]))
        return out

    def _size(self, gid: int, op, step: int) -> float:
        pairs = self._a2a_pairs(gid, op, step)
        return op.size_bytes if pairs is None else float(pairs.max()) * len(self.groups[gid][1])

    def _idle_costs(self, gids: tuple[int, ...], op, step: int) -> tuple[float | None, ...]:
        """:meth:`_idle_cost` of each of ``gids``, memoized as a whole (an EP op launches dozens at once)."""
        key = (gids, op.name, op.layer, op.size_bytes, op.duration_s,
               step if self.work is not None and self.work.step_dependent else 0)
        costs = self._group_costs.get(key)
        if costs is None:
            costs = self._group_costs[key] = tuple(self._idle_cost(g, op, step) for g in gids)
        return costs

    def _idle_cost(self, gid: int, op, step: int) -> float | None:
        """The idle-fabric cost of this collective, or None when it must run as flows (it contends,
        or it is an all-to-all-v whose pairs differ). Memoized: a decode step repeats its ops."""
        key = (gid, op.name, op.layer, op.size_bytes, op.duration_s,
               step if self.work is not None and self.work.step_dependent else 0)
        if key not in self._costs:
            self._costs[key] = self._cost(gid, op, step)
        return self._costs[key]

    def _cost(self, gid: int, op, step: int) -> float | None:
        kind = self.groups[gid][0]
        ex = self._deepep(gid, op, step)
        if ex is not None:  # DeepEP's kernels: their time for this draw, or as flows where they contend
            return None if not self.analytic_only and self.contended[gid] else ex.time_s
        pairs = self._a2a_pairs(gid, op, step)
        if not self.analytic_only and (self.contended[gid] or self._skewed(gid, op, step)):
            return None
        # contention off prices every collective as the lowering does (the proxy's check)
        shape = self.packed[kind] if self.analytic_only else self.shapes[gid]
        # the lowering's own price where it priced this very shape (it may use another algorithm,
        # e.g. DeepEP's kernels under sim.routing.a2a=deepep)
        if pairs is None and shape == self.packed[kind]:
            return op.duration_s
        return idle_cost_s(self.ctx, op.collective, self._size(gid, op, step), shape)

    def _flows(self, gid: int, op, step: int):
        ranks = self.groups[gid][1]
        self.flows_run += 1
        ex = self._deepep(gid, op, step)
        if ex is not None:
            yield self.env.process(run_exchange(self.env, self.network, ex, self.ctx.collective_constants,
                                                self.ctx.cluster.fabric))
        elif self._skewed(gid, op, step):
            yield self.env.process(run_alltoallv(self.env, self.network, self.ctx, ranks,
                                                 self._a2a_pairs(gid, op, step)))
        else:  # run_collective, its compiled program kept per communicator, collective and size
            key = (gid, op.collective, op.size_bytes)
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compiled[key] = compile_collective(self.network, op.collective, op.size_bytes,
                                                                    ranks, **self.kwargs)
            yield run_compiled(self.env, self.network, compiled)

    def _deepep(self, gid: int, op, step: int) -> Exchange | None:
        """The EP op as DeepEP's kernels on this draw (None unless the lowering priced it so).
        Contention off: on the lowering's packed communicator shape, as every other collective."""
        kind, ranks = self.groups[gid]
        mode = deepep_mode(op)
        if mode is None or kind != "ep" or self.work is None or op.collective != "all_to_all":
            return None
        key = (gid, op.name, op.layer, step if self.work.step_dependent else 0)
        if key not in self._exchanges:
            work = self.work.work(op.layer, step)
            k, tokens = self.ctx.model.top_k, self.work.tokens
            if work is None:  # no draw for this layer: every rank's copies spread evenly
                pair = np.full((len(ranks), len(ranks)), tokens * k / len(ranks))
            else:
                pair = work.pair_tokens if op.name != "combine" else work.pair_tokens.T
            per_token = token_bytes(self.ctx, op.name, self.work.bytes_per_copy(op.name))
            rpn = self.packed[kind][1] if self.analytic_only else None
            self._exchanges[key] = exchange(self.ctx, self.graph, ranks, pair, mode, tokens, k, per_token, rpn)
        return self._exchanges[key]

    def _pair_bytes(self, gid: int, op, step: int) -> np.ndarray | None:
        """Bytes each member sends each other member in this dispatch (combine: the reverse)."""
        work = self.work.work(op.layer, step) if self.work is not None else None
        if work is None:
            return None
        per_copy = self.work.bytes_per_copy(op.name)
        return work.pair_tokens * per_copy if op.name != "combine" else work.pair_tokens.T * per_copy

