"""A plan's workers behind one router: request intake, shape checks, and the KV hand-off.

:class:`RequestIntake` delays each request by the runtime's request path, then places it;
:class:`PoolCluster` holds an aggregated or disaggregated plan's workers (a disaggregated plan's KV moves
between pools as network flows on the topology graph, or at the idle fabric's rate without one);
:func:`shape_error` says why a pool's layout cannot run the model at all. Seesaw plans have their own
cluster (:mod:`simcore.serving.seesaw`).
"""

from __future__ import annotations

import simpy

from simcore.collectives.constants import DEFAULT, Fabric
from simcore.collectives.pipeline import nccl_link_efficiency
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import reason_names, structural_reasons
from simcore.network import FlowNetwork, gpu_nodes
from simcore.serving.fabric import StepFabric, network_report
from simcore.serving.kvcache import kv_capacity_tokens
from simcore.serving.plan import ServingPlan
from simcore.serving.requests import Request
from simcore.serving.runtime import RuntimeProfile
from simcore.serving.step_cost import StepCost
from simcore.serving.worker import PlanInfeasible, Worker

__all__ = ["PoolCluster", "RequestIntake", "pool_name", "shape_error"]

#: Strategy reasons that make a pool's layout unrunnable whatever the load (a split of heads, weights,
#: experts or layers the model does not allow, e.g. TP 64 over 32 attention heads).
_SHAPE_REASONS = ("heads_divisibility", "feature_divisibility", "experts_divisibility", "layers")


def pool_name(role: str) -> str:
    """``"the pool"`` of an aggregated plan, ``"the prefill pool"`` / ``"the decode pool"`` otherwise."""
    return "the pool" if role == "both" else f"the {role} pool"


def shape_error(ctx: CostContext, role: str, strategy) -> str | None:
    """Why a pool's layout cannot run the model at all, or None (a plan with one is refused by the
    simulation as infeasible, and by ``shard-sim`` as bad input)."""
    one = strategy.replace(dp=1, batch=strategy.ep, microbatches=1)
    names = [n for n in reason_names(structural_reasons(ctx, StrategyArrays.from_strategies([one]))[0])
             if n in _SHAPE_REASONS]
    if not names:
        return None
    return (f"{', '.join(names)}: {pool_name(role)}'s tp{strategy.tp} ep{strategy.ep} pp{strategy.pp} does not split "
            f"{ctx.model.name} ({ctx.model.num_heads} heads, {ctx.model.num_experts} experts, "
            f"{ctx.model.num_layers} layers) evenly")


class RequestIntake:
    """``route``: a request reaches its plan's scheduler after the runtime's request path (the fixed
    ``request_s`` plus ``tokenize_s_per_token`` per prompt token: :meth:`RuntimeProfile.request_path_s`),
    then ``_submit`` places it (the least-loaded worker)."""

    env: simpy.Environment
    runtime: RuntimeProfile
    trace = None  # a simcore.serving.trace.ServingTrace, or None (not tracing)

    def route(self, req: Request) -> None:
        if self.trace is not None:
            self.trace.arrived(req, self.env.now)
        delay = self.runtime.request_path_s(req.input_len)
        if delay > 0:
            self.env.process(self._after_intake(req, delay))
        else:
            self._submit(req)

    def _after_intake(self, req: Request, delay: float):
        yield self.env.timeout(delay)
        self._submit(req)

    def _submit(self, req: Request) -> None:
        raise NotImplementedError


class PoolCluster(RequestIntake):
    """The plan's workers, the router between them and the KV hand-off of disaggregated plans."""

    def __init__(self, env, ctx: CostContext, plan: ServingPlan, runtime: RuntimeProfile, graph, on_finish,
                 fast: bool = True, trace=None, contention: bool = True):
        self.env, self.ctx, self.graph, self.runtime = env, ctx, graph, runtime
        self.trace = trace
        self.pools: dict[str, list[Worker]] = {}
        self.kv_tokens: dict[str, int] = {}
        self.costs: list[StepCost] = []
        gpu0 = 0
        self.gpu_offsets: dict[int, int] = {}
        for role, pool in plan.pools:
            shape = shape_error(ctx, role, pool.strategy)
            if shape:
                raise PlanInfeasible(shape)
            cost = StepCost(ctx, pool.strategy, runtime, pool.moe_ep)
            self.costs.append(cost)
            kv = kv_capacity_tokens(ctx, pool.strategy, runtime)
            self.kv_tokens[role] = kv
            if kv <= 0:
                raise PlanInfeasible(f"hbm_capacity: {pool_name(role)}'s weights leave no room for a KV cache "
                                     f"(tp{pool.strategy.tp} ep{pool.strategy.ep} pp{pool.strategy.pp} on "
                                     f"{ctx.cluster.gpu.name})")
            workers = []
            for _w in range(pool.workers):
                worker = Worker(env, len(self.gpu_offsets), cost, runtime, kv, pool.max_num_seqs, on_finish,
                                role=role, on_prefilled=self._handoff, fast=fast, trace=trace)
                self.gpu_offsets[worker.wid] = gpu0
                gpu0 += pool.gpus_per_worker
                workers.append(worker)
            self.pools[role] = workers
        self.gpus_per_worker = {role: pool.gpus_per_worker for role, pool in plan.pools}
        self.network, self.fabric, self.kv_flows = None, None, 0
        if graph is not None:
            self._network(env, graph, plan, gpu0, trace, contention)
        m = ctx.model
        self.kv_bytes_per_token = m.kv_cache_bytes_per_token(ctx.workload.kv_bytes)
        self.state_bytes = m.linear_state_bytes_per_sequence(ctx.workload.activation_bytes)  # hybrids' fixed state

    def _network(self, env, graph, plan: ServingPlan, gpus: int, trace, contention: bool) -> None:
        """The plan's network: a disaggregated plan's KV hand-offs, and with ``contention`` the steps'
        communication that shares links with other traffic (:mod:`.fabric`); none for an aggregated
        plan whose steps share nothing (their closed form is exact) or that the graph cannot hold."""
        self.gpu_names = gpu_nodes(graph)
        if gpus > len(self.gpu_names):
            if plan.mode == "disagg":
                raise PlanInfeasible(f"device_count: the plan needs {gpus} GPUs, the cluster has {len(self.gpu_names)}")
            return
        network = FlowNetwork(env, graph, record=trace is not None)  # the trace's link counters
        if contention:
            fabric = StepFabric(env, self.ctx, graph, network, self.gpu_names)
            workers = [(w, self.gpu_offsets[w.wid]) for ws in self.pools.values() for w in ws]
            fabric.place(workers, self._kv_links(network))
            if any(v.active for v in fabric.workers):
                # the collectives' link efficiencies (NCCL's fractions), set before any flow, on every flow
                network.set_link_efficiency(nccl_link_efficiency(graph, DEFAULT, Fabric.from_topology(graph)))
                for view in fabric.workers:
                    view.worker.net = view if view.active else None
                self.fabric = fabric
        if plan.mode == "disagg" or self.fabric is not None:
            self.network = network

    def _kv_links(self, network) -> set:
        """Every link a KV hand-off may cross (:meth:`_transfer`'s pairs between any two workers)."""
        if "prefill" not in self.pools:
            return set()
        links: set = set()
        n_src, n_dst = self.gpus_per_worker["prefill"], self.gpus_per_worker["decode"]
        for src in self.pools["prefill"]:
            for dst in self.pools["decode"]:
                a, b = self.gpu_offsets[src.wid], self.gpu_offsets[dst.wid]
                for i in range(n_src):
                    links.update(network.path(self.gpu_names[a + i], self.gpu_names[b + i % n_dst]))
        return links

    def network_report(self, end_s: float) -> dict:
        """The run's network counters (:func:`~simcore.serving.fabric.network_report`)."""
        workers = [w for ws in self.pools.values() for w in ws]
        if self.fabric is not None:
            return self.fabric.report(end_s, workers, self.kv_flows)
        return network_report(self.network, end_s, self.kv_flows, 0.0, sum(w.gpu_busy_s for w in workers))

    def _submit(self, req: Request) -> None:
        entry = self.pools.get("both") or self.pools["prefill"]
        min(entry, key=lambda w: w.load).submit(req)

    def _handoff(self, req: Request, src: Worker) -> None:
        req.hold_first()  # streamed by the decode worker (module doc)
        if self.trace is not None:
            self.trace.hand_off(req, self.env.now)
        dst = min(self.pools["decode"], key=lambda w: w.load)
        dst.incoming += 1  # outstanding there from now: the next hand-off sees it (Worker.load)
        self.env.process(self._transfer(req, src, dst))

    def _transfer(self, req: Request, src: Worker, dst: Worker):
        nbytes = req.kv_tokens * self.kv_bytes_per_token + self.state_bytes
        n_src, n_dst = self.gpus_per_worker["prefill"], self.gpus_per_worker["decode"]
        if self.network is not None:
            a, b = self.gpu_offsets[src.wid], self.gpu_offsets[dst.wid]
            pairs = [(self.gpu_names[a + i], self.gpu_names[b + i % n_dst]) for i in range(n_src)]
            self.kv_flows += len(pairs)
            yield self.network.transfer_group(pairs, nbytes / n_src, tag=("kv", req.rid))
        else:  # idle fabric: each source GPU sends its shard over its NIC
            fabric_bw = self.ctx.cluster.gpu.nic_bandwidth_bytes_per_s
            yield self.env.timeout(nbytes / n_src / fabric_bw)
        req.handoff_s = self.env.now
        if self.trace is not None:
            self.trace.handed(req, self.env.now, "kv hand-off", {"bytes": nbytes, "from": f"worker {src.wid}",
                                                               "to": f"worker {dst.wid}"})
        dst.incoming -= 1
        dst.submit(req)
