"""A serving step's own communication on the network: which workers' collectives run as flows, and how.

The lowering prices a step's tensor-parallel all-reduces, expert dispatch and combine and pipeline sends
in closed form (:class:`~simcore.serving.step_cost.StepCost`): exact on an idle fabric, blind to traffic
that shares its links. :class:`StepFabric` decides once per worker and communicator kind (``tp``,
``ep``, ``pp`` of each stage) whether that closed form may be wrong, as the static engine's
:meth:`~simcore.engine.comm.FlowComm.contended` does: where the kind's links (:func:`~simcore.collectives.links.flow_links`
of its groups on the worker's GPUs, a contiguous window, ranks numbered as
:class:`~simcore.strategy.rank_placement.Placement` numbers them) meet another worker's, a KV hand-off's
route, or each other (several concurrent groups of one kind), or cross the fabric's interior (a
leaf-spine link: the closed form sees each GPU's NVLink and NIC, never a spine), the kind runs as flows on the one
:class:`~simcore.network.flownet.FlowNetwork` the plan's workers and KV transfers share, in the requests'
SimPy clock. Elsewhere the closed form stays, untouched.

A step whose kinds run as flows is folded: its ``count`` identical collectives of a kind (one per
layer) run as one collective of ``count`` times the bytes, on every group of the kind at once (NCCL's
flows, :func:`~simcore.collectives.flows.compile_collective`, or DeepEP's,
:func:`~simcore.moe.deepep_exchange.uniform_exchange` at the step's busiest-rank load, its mode the
step's: low latency for pure decode). Each folded op's reference time ``I`` (its groups one by one on an
idle copy of the fabric whose interior never binds, :func:`nonblocking_interior`, memoized) is known, so
the step spends ``closed - sum(I)`` computing and then runs its ops, each taking ``E >= I``: on an idle
non-blocking fabric the step takes exactly its closed form (a test); an oversubscribed spine and
contention add ``E - I``, the step's wait on the network, waiting for its slowest flow (and, through
the busiest-rank load in the exchange's bytes, for its slowest rank). Under two-batch overlap the
exchanges run beside the compute instead (:func:`~simcore.serving.step_cost.two_batch_overlap_s`).
The fold puts all of a step's traffic of a kind in one burst after its compute: what contends is
right in bytes, coarser in timing than the per-layer interleaving it replaces.

Counters (:meth:`StepFabric.report`): the flows started, bytes per tier (NVLink, NIC, leaf-spine), the
busiest link and its utilization over the run, and the share of step time spent waiting on the network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from simcore.collectives.flows import compile_collective, run_compiled
from simcore.collectives.links import flow_links
from simcore.cost.lowering import CostContext
from simcore.moe.deepep_exchange import Exchange, run_exchange, token_bytes, uniform_exchange
from simcore.network import FlowNetwork
from simcore.strategy import layout as L
from simcore.strategy.rank_placement import Placement

__all__ = ["StepFabric", "WorkerFabric", "link_tier", "TIERS"]

TIERS = ("nvlink", "nic", "leaf_spine")
_KINDS = ("tp", "ep", "pp")


def link_tier(graph, u: str, v: str) -> str:
    """``nvlink`` (a GPU's NVSwitch or NVLink port), ``leaf_spine`` (a link touching a spine), else ``nic``
    (a GPU or NIC to its leaf)."""
    kinds = {graph.nodes[u].get("kind"), graph.nodes[v].get("kind")}
    if "nvswitch" in kinds or kinds == {"gpu"}:
        return "nvlink"
    return "leaf_spine" if "spine" in kinds else "nic"


@dataclass
class _Op:
    """One folded op of a stage: ``kind``'s ``name`` (a collective or a DeepEP exchange), ``mult`` copies of
    the lowering's task of ``size_bytes`` each, ``closed_s`` their closed-form seconds, and per group what
    runs on the network (``programs``) and the slowest group's idle seconds (``idle_s``)."""

    kind: str
    name: str
    closed_s: float
    programs: list
    idle_s: float
    flows: int


class WorkerFabric:
    """One worker's communicators on the shared network: ``kinds[stage]``, the kinds that run as flows."""

    def __init__(self, fabric: StepFabric, worker, offset: int):
        self.fabric, self.worker, self.cost = fabric, worker, worker.cost
        self.deepep = getattr(self.cost.ctx.routing, "a2a", None) == "deepep"  # the runtime's or the context's
        s = self.cost.strategy
        gpus = fabric.gpu_names[offset: offset + s.tp * s.ep * s.pp]
        self.placement = Placement(s.replace(dp=1), gpus, fabric.gpus_per_node)
        self.groups = {(k, p): [g for g in self.placement.groups(k, p) if len(set(g)) > 1]
                       for k in _KINDS for p in range(s.pp) if not (k == "pp" and p == s.pp - 1)}
        self.links = {key: self._links(key[0], gs) for key, gs in self.groups.items()}
        self.kinds: list[set[str]] = [set() for _ in range(s.pp)]
        self.wait_s = 0.0  # seconds its steps waited on the network beyond their closed form
        self._ops: dict[tuple, list[_Op]] = {}

    def _links(self, kind: str, groups: list[list[str]]) -> list[set]:
        net, direct = self.fabric.network, kind == "ep" and self.deepep
        return [flow_links(net.graph, net, g, direct) for g in groups]

    def all_links(self) -> set:
        return set().union(*(ls for sets in self.links.values() for ls in sets))

    def decide(self, others: set) -> None:
        """Put on the network each kind whose links meet ``others`` (other workers', KV routes), another
        stage's of this worker, or each other's, or that crosses the fabric's interior (a leaf-spine
        link, which the closed form does not see)."""
        for (kind, p), sets in self.links.items():
            mine = set().union(*sets)
            if not mine:
                continue
            other_stages = set().union(*(ls for (k, q), s2 in self.links.items() if q != p for ls in s2))
            seen, self_shared = set(), False
            for ls in sets:
                self_shared |= bool(seen & ls)
                seen |= ls
            interior = any(link_tier(self.fabric.graph, u, v) == "leaf_spine" for u, v in mine)
            if self_shared or interior or mine & others or mine & other_stages:
                self.kinds[p].add(kind)

    @property
    def active(self) -> bool:
        return any(self.kinds)

    # ------------------------------------------------------------------ a step
    def run(self, stage: int, closed_s: float, batches):
        """Process body: the step's ``stage`` on the network, ``closed_s`` its closed-form seconds;
        value: the seconds it took (module doc)."""
        env = self.fabric.env
        key = self.cost.step_key(batches)
        ops = self.ops(key, stage) if key is not None and self.kinds[stage] else []
        if not ops:
            yield env.timeout(closed_s)
            return closed_s
        start = env.now
        runtime = self.worker.runtime
        ex_ops = [o for o in ops if o.kind == "ep"] if runtime.two_batch_overlap else []
        rest = [o for o in ops if o not in ex_ops]
        if ex_ops:  # exchanges beside the compute, the rest after (step_cost.two_batch_overlap_s)
            compute, c_ep = self.cost.overlap_parts(batches, runtime)[stage]
            overlapped = max(c_ep - sum(o.idle_s for o in ex_ops), 0.0)
            yield env.all_of([env.timeout(compute), env.process(self._ops_after(overlapped, ex_ops))])
            closed_rest = closed_s - max(compute, c_ep)  # the fill and the other kinds' communication
            yield from self._ops_after(max(closed_rest - sum(o.idle_s for o in rest), 0.0), rest)
        else:
            yield from self._ops_after(max(closed_s - sum(o.idle_s for o in ops), 0.0), ops)
        took = env.now - start
        self.wait_s += max(took - closed_s, 0.0)
        return took

    def _ops_after(self, compute_s: float, ops: list[_Op]):
        env = self.fabric.env
        if compute_s > 0:
            yield env.timeout(compute_s)
        for op in ops:
            yield env.all_of([self.fabric.start(p) for p in op.programs])
            self.fabric.flows += op.flows

    def ops(self, key: tuple[int, int, bool], stage: int) -> list[_Op]:
        """The stage's folded ops at step ``key`` (``(tokens, sampled, decode)``), memoized."""
        memo = (key, stage)
        if memo not in self._ops:
            self._ops[memo] = self._fold(key, stage)
        return self._ops[memo]

    def _fold(self, key: tuple[int, int, bool], stage: int) -> list[_Op]:
        tokens, sampled, decode = key
        cost, s = self.cost, self.cost.strategy
        blocks = cost.block_tasks(tokens, sampled, decode)
        counted = [(cost.dense_layers[stage], blocks.get("dense_layer", [])),
                   (cost.moe_layers[stage], blocks.get("moe_layer", []))]
        counted += [(1, blocks["first"])] if stage == 0 else []
        counted.append((1, blocks["last"] if stage == s.pp - 1 else blocks["p2p"]))
        folded: dict[tuple, list] = {}
        for n, tasks in counted:
            for t in tasks:
                if not t.is_comm or t.kind == "host" or t.group not in self.kinds[stage] or n == 0:
                    continue
                coll = int(t.extra.get("collective", 0))
                if coll == L.NONE or float(t.size_bytes) <= 0:
                    continue
                algorithm = str(t.extra.get("algorithm", ""))
                entry = folded.setdefault((t.group, coll, algorithm), [0.0, 0.0])
                entry[0] += n * t.count * self._payload(t, tokens, algorithm)
                entry[1] += n * t.count * cost.task_s(t)
        return [self._op(k, payload, closed, tokens, stage) for k, (payload, closed) in folded.items()]

    def _payload(self, task, tokens: int, algorithm: str) -> float:
        """What one task moves: its bytes, or for DeepEP's kernels the bytes of one token copy
        (:func:`~simcore.moe.deepep_exchange.token_bytes`, as the lowering prices them)."""
        if not algorithm.startswith("deepep_"):
            return float(task.size_bytes)
        ctx = self.cost.ctx
        copies = float(max(tokens, 1)) * ctx.model.top_k * self.cost.expert_load(tokens)
        return token_bytes(ctx, task.name, float(task.size_bytes) / max(copies, 1e-30))

    def _op(self, k: tuple, payload: float, closed_s: float, tokens: int, stage: int) -> _Op:
        """One kind's folded op of a step: the step's collectives of one kind and algorithm as one of all
        their bytes, or its DeepEP dispatches and combines as one exchange of all their token bytes."""
        kind, coll, algorithm = k
        groups = self.groups[(kind, stage)]
        fab = self.fabric
        if algorithm.startswith("deepep_"):
            load = self.cost.expert_load(tokens)
            programs = [fab.exchange(self.cost.ctx, g, algorithm[len("deepep_"):], float(max(tokens, 1)), payload, load)
                        for g in groups]
            flows = sum(int(np.count_nonzero(e.nvlink) + np.count_nonzero(e.rdma)) for e in programs)
        else:
            programs = [("nccl", L.COLLECTIVE_NAMES[coll], payload, tuple(g)) for g in groups]
            flows = sum(fab.nccl_flows(p) for p in programs)
        name = algorithm or L.COLLECTIVE_NAMES[coll]
        return _Op(kind, name, closed_s, programs, max(fab.idle_s(p) for p in programs), flows)


class StepFabric:
    """The plan's shared network: each worker's :class:`WorkerFabric`, the flows its steps start, and
    the idle copy of the fabric that times a folded op alone."""

    def __init__(self, env: simpy.Environment, ctx: CostContext, graph, network: FlowNetwork, gpu_names: list[str]):
        self.env, self.ctx, self.graph, self.network = env, ctx, graph, network
        self.gpu_names = gpu_names
        self.gpus_per_node = int(graph.graph.get("gpus_per_node", ctx.cluster.nvlink_domain_size))
        self.workers: list[WorkerFabric] = []
        self.flows = 0
        self._idle: dict = {}
        self._exchanges: dict = {}
        self._scratch = None

    def place(self, workers_offsets: list[tuple], kv_links: set) -> None:
        """Build each worker's view and decide which of its kinds run as flows (module doc)."""
        views = [WorkerFabric(self, w, off) for w, off in workers_offsets]
        links = [v.all_links() for v in views]
        for i, v in enumerate(views):
            others = set(kv_links).union(*(ls for j, ls in enumerate(links) if j != i))
            v.decide(others)
        self.workers = views

    # ------------------------------------------------------------------ programs
    def exchange(self, ctx, ranks: list[str], mode: str, tokens: float, tok_bytes: float, load: float) -> Exchange:
        """DeepEP's uniform exchange over ``ranks`` (memoized: its flow program is kept per exchange)."""
        key = (tuple(ranks), mode, tokens, tok_bytes, load)
        ex = self._exchanges.get(key)
        if ex is None:
            ex = self._exchanges[key] = uniform_exchange(ctx, self.graph, list(ranks), mode, tokens,
                                                         ctx.model.top_k, tok_bytes, load)
        return ex

    def start(self, program, network: FlowNetwork | None = None) -> simpy.events.Process:
        net = network or self.network
        if isinstance(program, Exchange):
            return net.env.process(run_exchange(net.env, net, program, spread=False))
        _, coll, size, ranks = program
        return run_compiled(net.env, net, compile_collective(net, coll, size, list(ranks)))

    def nccl_flows(self, program) -> int:
        _, coll, size, ranks = program
        compiled = compile_collective(self.network, coll, size, list(ranks))
        return sum(len(g.chains) for _, groups, _, _ in compiled[0] for g in groups)

    def idle_s(self, program) -> float:
        """Seconds ``program`` takes alone on an idle copy of the fabric whose interior (every leaf-spine
        link) never binds (memoized): what the closed form assumes, each GPU limited by its own NVLink
        and NIC only. On the real fabric the same program alone may take longer (an oversubscribed
        spine, ECMP collisions): the step waits for that too, its slowest link."""
        key = program if not isinstance(program, Exchange) else id(program)
        if key not in self._idle:
            if self._scratch is None:
                env = simpy.Environment()
                self._scratch = FlowNetwork(env, nonblocking_interior(self.graph), seed=self.network.seed,
                                            link_efficiency=self.network.link_efficiency)
            net = self._scratch
            t0 = net.env.now
            proc = self.start(program, net)
            net.env.run(until=proc)
            self._idle[key] = net.env.now - t0
        return self._idle[key]

    # ------------------------------------------------------------------ counters
    def report(self, end_s: float, workers: list, kv_flows: int = 0) -> dict:
        """``network`` of a serving result (module doc)."""
        return network_report(self.network, end_s, self.flows + kv_flows,
                              sum(v.wait_s for v in self.workers), sum(w.gpu_busy_s for w in workers),
                              {v.worker.role: sorted(set().union(*v.kinds)) for v in self.workers if v.active})


def nonblocking_interior(graph):
    """A copy of ``graph`` whose leaf-spine links carry a million times their bandwidth."""
    copy = graph.copy()
    for u, v, data in copy.edges(data=True):
        if link_tier(copy, u, v) == "leaf_spine":
            data["bandwidth_bytes_per_s"] = float(data["bandwidth_bytes_per_s"]) * 1e6
    return copy


def network_report(network: FlowNetwork | None, end_s: float, flows: int, wait_s: float, busy_s: float,
                   step_flows: dict | None = None) -> dict:
    """The run's network counters: ``flows`` started, ``bytes`` per tier, the ``busiest_link`` and its
    ``busiest_utilization`` (bytes over capacity times the run), ``network_wait_share`` (the share of the
    workers' step time spent waiting on the network beyond the closed form), and which communicator
    kinds ran as flows on each pool (``step_flows``)."""
    tiers = dict.fromkeys(TIERS, 0.0)
    busiest, util = None, 0.0
    if network is not None:
        capacity = network.capacity
        for (u, v), nbytes in network.link_bytes.items():
            tiers[link_tier(network.graph, u, v)] += nbytes
            u_link = nbytes / (capacity[(u, v)] * end_s) if end_s > 0 else 0.0
            if u_link > util:
                busiest, util = f"{u}->{v}", u_link
    return {"flows": int(flows), "bytes": tiers, "busiest_link": busiest, "busiest_utilization": util,
            "network_wait_share": wait_s / busy_s if busy_s > 0 else 0.0, "step_flows": step_flows or {}}
