"""Seesaw: one pool of workers, each re-sharding between a prefill layout and a decode layout.

Seesaw (Su et al., "Seesaw: High-throughput LLM Inference via Model Re-sharding", MLSys 2025,
arXiv 2503.06433) prefills and decodes on the same GPUs under different shardings: prefill under one
that communicates little per token (pipeline stages), decode under tensor parallelism (each step reads
the weights once, over every GPU's HBM). A worker here is two :class:`~simcore.serving.worker.Worker`
s on the same GPUs, one per layout, and only one of them has work at a time:

- **prefill phase**: prefill steps priced with the prefill layout; a request's first token (its TTFT)
  comes with its last prompt chunk, then its KV is copied over PCIe into host memory (the tiered KV
  buffer, ``ServingPlan.host_kv_bytes_per_gpu`` per GPU, reserved when the request is admitted),
  while the next steps run.
- **decode phase**: parked requests come back over PCIe and decode with the decode layout's steps.

Transition-minimizing scheduling: stay in prefill while requests wait and the host buffer holds the
next one's KV; once it does not (or nothing waits) and the prefills and copies in flight have landed,
re-shard and decode; decode until nothing is parked, in transit or running ("no more decodes"), then
re-shard back if requests wait. Each phase thus ends with no KV resident on the GPUs, so the resident
term of the re-shard is 0 under this policy (it is priced all the same from what the GPUs hold).

Swaps: at the switch to decode, the first batch (parked requests in order, as many as ``max_num_seqs``
and the decode layout's KV cache hold, each reserved for its whole output so that none is evicted) is
copied in before decoding starts, charged in full; the rest stream in while that batch decodes, one
copy at a time per direction. A request's KV crosses every GPU's own host link at once, so a copy
takes the fullest GPU's share (:func:`~simcore.serving.kvcache.kv_bytes_per_token`) over
:data:`PCIE_BYTES_PER_S`: PCIe Gen5 x16, the H100/H200 SXM host link, 32 GT/s x 16 lanes x 128/130
(encoding) / 8 = 63.0 GB/s per direction (PCI-SIG, PCI Express Base Specification 5.0). A prompt's
GPU blocks are freed when its prefill ends; its copy out runs beside the next prefill steps.

Re-shard: :func:`~simcore.serving.reshard.reshard_s` (what each GPU lacks under the new layout, over
NVLink, or the NICs for a worker wider than one NVLink domain). Hosts' memory bandwidth is taken as ample.
"""

from __future__ import annotations

from collections import deque

import simpy

from simcore.cost.lowering import CostContext
from simcore.serving.cluster import RequestIntake, shape_error
from simcore.serving.kvcache import kv_bytes_per_token, kv_capacity_tokens, state_bytes_per_sequence
from simcore.serving.plan import ServingPlan
from simcore.serving.requests import Request
from simcore.serving.reshard import reshard_s
from simcore.serving.runtime import RuntimeProfile
from simcore.serving.step_cost import StepCost
from simcore.serving.worker import PlanInfeasible, Worker

__all__ = ["PCIE_BYTES_PER_S", "SeesawWorker", "SeesawCluster"]

#: PCIe Gen5 x16 per direction: 32 GT/s x 16 lanes x 128b/130b / 8 bits (PCI Express Base Spec 5.0).
PCIE_BYTES_PER_S = 32e9 * 16 * (128 / 130) / 8


class SeesawWorker:
    """One Seesaw worker: a prefill :class:`Worker` and a decode :class:`Worker` on the same GPUs, the
    host buffer between them and the phase controller (module docstring)."""

    def __init__(self, cluster: SeesawCluster, wid: int, on_finish, fast: bool):
        self.cluster, self.env, self.on_finish = cluster, cluster.env, on_finish
        plan, rt = cluster.plan, cluster.runtime
        seqs = plan.prefill.max_num_seqs
        self.trace = cluster.trace
        self.prefill = Worker(self.env, 2 * wid, cluster.costs[0], rt, cluster.kv_tokens["prefill"], seqs,
                              self._finished, role="prefill", on_prefilled=self._prefilled, fast=fast,
                              trace=self.trace)
        self.decode = Worker(self.env, 2 * wid + 1, cluster.costs[1], rt, cluster.kv_tokens["decode"], seqs,
                             self._finished, role="decode", fast=fast, trace=self.trace)
        self.max_num_seqs = seqs
        self.host_capacity = plan.host_kv_bytes_per_gpu * plan.prefill.gpus_per_worker
        self.host_free = self.host_capacity
        self.layout = "prefill"
        self.queue: deque[Request] = deque()
        self.parked: deque[Request] = deque()
        self._host: dict[int, float] = {}  # rid -> host bytes reserved
        self._reserved: dict[int, int] = {}  # rid -> decode KV blocks reserved (fed to the decode worker)
        self._links = {"out": simpy.Resource(self.env, 1), "in": simpy.Resource(self.env, 1)}
        self._copying = {"out": 0, "in": 0}
        self.reshard_s = self.swap_in_s = 0.0
        self.switches = 0
        self._wake = self.env.event()
        self.env.process(self._control())

    # ------------------------------------------------------------------ requests in and out
    @property
    def load(self) -> int:
        return (len(self.queue) + self.prefill.load + len(self.parked) + sum(self._copying.values())
                + self.decode.load)

    def submit(self, req: Request) -> None:
        if self._host_bytes(req) > self.host_capacity:
            raise PlanInfeasible(f"host_kv: one request's KV ({self._host_bytes(req) / 1e9:.1f} GB) exceeds the "
                                 f"seesaw worker's host buffer ({self.host_capacity / 1e9:.1f} GB)")
        kv = self.decode.groups[0].kv
        if self._blocks(req) > kv.total_blocks:
            raise PlanInfeasible(f"kv_capacity: one request of {req.input_len}+{req.output_len} tokens needs more "
                                 f"KV than the decode layout's attention group holds "
                                 f"({kv.total_blocks * kv.block_tokens} tokens)")
        self.queue.append(req)
        self._poke()

    def _host_bytes(self, req: Request) -> float:
        return req.prefill_target * self.cluster.kv_bytes_per_token + self.cluster.state_bytes

    def _blocks(self, req: Request) -> int:
        return self.decode.groups[0].kv.blocks_alone(req.input_len + req.output_len)

    def _copy_s(self, req: Request, role: str) -> float:
        per_token, state = self.cluster.pcie_bytes[role]
        return (req.prefill_target * per_token + state) / PCIE_BYTES_PER_S

    def _finished(self, req: Request) -> None:
        self.host_free += self._host.pop(req.rid, 0.0)  # a one-token request ends at its prefill
        self._reserved.pop(req.rid, None)
        self.on_finish(req)
        self._poke()

    def _prefilled(self, req: Request, _worker: Worker) -> None:
        if self.trace is not None:
            self.trace.hand_off(req, self.env.now)
        self._copying["out"] += 1
        self.env.process(self._copy(req, "out"))

    def _copy(self, req: Request, way: str):
        """One request's KV over the host links: out to the buffer (parked) or in to the decode worker."""
        with self._links[way].request() as turn:
            yield turn
            yield self.env.timeout(self._copy_s(req, "prefill" if way == "out" else "decode"))
        self._copying[way] -= 1
        if way == "out":
            self.parked.append(req)
        else:
            self._land(req)
        self._poke()

    def _land(self, req: Request) -> None:
        if self.trace is not None:
            self.trace.handed(req, self.env.now, "parked in host memory")
        self.host_free += self._host.pop(req.rid, 0.0)
        self.decode.submit(req)

    # ------------------------------------------------------------------ the phases
    def _poke(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def _sleep(self):
        self._wake = self.env.event()
        yield self._wake

    def _control(self):
        while True:
            if self.queue:
                yield from self._switch("prefill")
                yield from self._prefill_phase()
            if self.parked:
                yield from self._switch("decode")
                yield from self._decode_phase()
            elif not self.queue:
                yield from self._sleep()

    def _switch(self, layout: str):
        if layout == self.layout:
            return
        resident = sum(r.kv_tokens for w in (self.prefill, self.decode) for g in w.groups for r in g.running)
        t = self.cluster.reshard_time(self.layout, layout, resident)
        self.layout = layout
        self.switches += 1
        self.reshard_s += t
        if t > 0:
            yield self.env.timeout(t)

    def _prefill_phase(self):
        while True:
            while self.queue and self._host_bytes(self.queue[0]) <= self.host_free:
                req = self.queue.popleft()
                self._host[req.rid] = self._host_bytes(req)
                self.host_free -= self._host[req.rid]
                self.prefill.submit(req)
            if self.prefill.load == 0 and self._copying["out"] == 0:
                return  # nothing waits, or the buffer is full: everything admitted is parked
            yield from self._sleep()

    def _take(self) -> list[Request]:
        """Parked requests the decode worker can take now (``max_num_seqs``, whole-output KV)."""
        out = []
        capacity = sum(g.kv.total_blocks for g in self.decode.groups)
        while self.parked and len(self._reserved) < self.max_num_seqs:
            blocks = self._blocks(self.parked[0])
            if sum(self._reserved.values()) + blocks > capacity:
                break
            req = self.parked.popleft()
            self._reserved[req.rid] = blocks
            out.append(req)
        return out

    def _decode_phase(self):
        first = self._take()
        t = sum(self._copy_s(r, "decode") for r in first)
        self.swap_in_s += t
        yield self.env.timeout(t)
        for req in first:
            self._land(req)
        while True:
            for req in self._take():
                self._copying["in"] += 1
                self.env.process(self._copy(req, "in"))
            if self.decode.load == 0 and not self.parked and self._copying["in"] == 0:
                return
            yield from self._sleep()


class SeesawCluster(RequestIntake):
    """The plan's Seesaw workers and the router in front of them (least outstanding requests)."""

    def __init__(self, env, ctx: CostContext, plan: ServingPlan, runtime: RuntimeProfile, on_finish,
                 fast: bool = True, trace=None):
        self.env, self.ctx, self.plan, self.runtime = env, ctx, plan, runtime
        self.trace = trace
        self.costs: list[StepCost] = []
        self.kv_tokens: dict[str, int] = {}
        self.pcie_bytes: dict[str, tuple[float, float]] = {}
        for role, pool in plan.pools:
            shape = shape_error(ctx, role, pool.strategy)
            if shape:
                raise PlanInfeasible(shape)
            self.costs.append(StepCost(ctx, pool.strategy, runtime))
            self.kv_tokens[role] = kv_capacity_tokens(ctx, pool.strategy, runtime)
            if self.kv_tokens[role] <= 0:
                raise PlanInfeasible(f"hbm_capacity: the {role} layout's weights leave no room for a KV cache")
            self.pcie_bytes[role] = (kv_bytes_per_token(ctx, pool.strategy), state_bytes_per_sequence(ctx, pool.strategy))
        m = ctx.model
        self.kv_bytes_per_token = m.kv_cache_bytes_per_token(ctx.workload.kv_bytes)
        self.state_bytes = m.linear_state_bytes_per_sequence(ctx.workload.activation_bytes)
        self._reshard: dict[tuple[str, str], float] = {}
        self.workers = [SeesawWorker(self, w, on_finish, fast) for w in range(plan.prefill.workers)]
        self.pools = {"prefill": [w.prefill for w in self.workers], "decode": [w.decode for w in self.workers]}

    def reshard_time(self, src: str, dst: str, resident_tokens: float) -> float:
        layouts = {"prefill": self.plan.prefill.strategy, "decode": self.plan.decode.strategy}
        if resident_tokens:
            return reshard_s(self.ctx, layouts[src], layouts[dst], resident_tokens)
        if (src, dst) not in self._reshard:
            self._reshard[src, dst] = reshard_s(self.ctx, layouts[src], layouts[dst])
        return self._reshard[src, dst]

    @property
    def reshard_s(self) -> float:
        return sum(w.reshard_s for w in self.workers)

    @property
    def switches(self) -> int:
        return sum(w.switches for w in self.workers)

    @property
    def swap_in_s(self) -> float:
        return sum(w.swap_in_s for w in self.workers)

    def _submit(self, req: Request) -> None:
        min(self.workers, key=lambda w: w.load).submit(req)
