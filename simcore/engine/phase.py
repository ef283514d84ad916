"""One simulated phase (a prefill, or the decode steps at one context length) in either mode.

``folded``: one process per (stage, microbatch) stands for every GPU of the stage
(:class:`~simcore.engine.executor.Executor` with :class:`~simcore.engine.comm.FlowComm`); exact only
where every GPU of a stage runs the same program on a symmetric placement and fabric. ``per-gpu``:
lanes of GPUs with their own programs and rendezvous collectives (:mod:`.pergpu`), one lane per GPU
except orbits proven identical (:mod:`.lanes`). :func:`choose_mode` decides what ``auto`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from simcore.collectives import DEFAULT
from simcore.collectives.cost import make_shape
from simcore.collectives.flows import resolve
from simcore.cost.lowering import CostContext
from simcore.engine.alltoallv import pxn_relay
from simcore.engine.comm import AnalyticComm, FlowComm
from simcore.engine.contention import all_groups, contention_flags, direct_kinds
from simcore.engine.executor import Executor
from simcore.engine.lane_executor import LaneExecutor
from simcore.engine.lanes import Lane, build_lanes, merged_axes, symmetric_axes
from simcore.engine.moework import RankPrograms, tokens_per_rank
from simcore.engine.pergpu import LaneComm
from simcore.engine.pricing import group_shape, reprice_programs
from simcore.engine.program import build_programs
from simcore.engine.rank_loads import rank_loads
from simcore.moe.deepep_exchange import FoldedExchanges, deepep_mode
from simcore.network import FlowNetwork, gpu_nodes
from simcore.strategy.rank_placement import Placement
from simcore.strategy.sharding import Strategy

__all__ = ["Phase", "choose_mode", "run_folded", "run_per_gpu", "placement_of"]


@dataclass
class Phase:
    time_s: float
    intervals: list
    window: tuple[float, float]
    periods: int
    events: int
    link_bytes: dict
    utilization: dict
    lanes: list[Lane]  # the GPUs each interval's ``stage`` index stands for (folded: one lane per stage)
    analytic: list  # (ranks, collective, size_bytes, start_s, end_s) of collectives that skipped the solver
    flows_run: int = 0


def placement_of(graph, s: Strategy, rule: str) -> Placement:
    return Placement(s, gpu_nodes(graph), int(graph.graph["gpus_per_node"]), rule)


def _network(env, graph, cfg, record: bool):
    return FlowNetwork(env, graph, seed=cfg.seed, record=record)


def choose_mode(ctx: CostContext, graph, s: Strategy, cfg) -> tuple[str, str, dict[str, list[int]]]:
    """``(mode, reason, orbits)`` for ``cfg.mode`` (``orbits``: per rank axis, the lanes' orbits,
    :func:`.lanes.symmetric_axes`); ``auto`` folds only where that is exact."""
    if cfg.mode == "folded":
        return "folded", "sim.mode=folded (asked for; exact only where placement, fabric and routing are symmetric)", {}
    if cfg.mode == "per-gpu" and not cfg.share_lanes:
        return "per-gpu", "sim.mode=per-gpu, one lane per GPU (sim.share_lanes=false)", {}
    steps = cfg.decode_steps if ctx.workload.phase == "decode" else 1
    work = RankPrograms(ctx, s, "prefill" if ctx.workload.phase != "decode" else "decode", None, cfg)
    equal = work.equal_loads(steps)
    placement = placement_of(graph, s, cfg.placement)
    network = _network(simpy.Environment(), graph, cfg, False)
    groups = all_groups(placement)
    direct = direct_kinds(ctx)
    flags = contention_flags(graph, network, groups, direct) if cfg.contention else [False] * len(groups)
    contended = {(k, tuple(r)): f for (k, r), f in zip(groups, flags, strict=True)}
    orbits, why = symmetric_axes(placement, graph, network, equal, pxn_relay,
                                 _order_free(ctx, graph, s, placement), contended, direct)
    if cfg.mode == "per-gpu":
        return "per-gpu", f"sim.mode=per-gpu; lanes shared along proven symmetries: {_describe(orbits)}", orbits
    if not equal:
        return "per-gpu", "auto: MoE routing gives EP ranks different work", orbits
    if why:
        bad = "; ".join(f"rank axis {a}: {r}" for a, r in why.items())
        return "per-gpu", f"auto: not symmetric ({bad})", orbits
    return "folded", "auto: placement, fabric and routing are symmetric along every rank axis", orbits


def _describe(orbits: dict[str, list[int]]) -> str:
    """``"axes ['i', 'd'], e in 4 orbits"``: the axes merged whole, then those merged in part."""
    whole = merged_axes(orbits)
    part = [f"{a} in {len(set(o))} orbits" for a, o in orbits.items() if a not in whole and len(set(o)) < len(o)]
    return ", ".join([f"axes {whole or 'none'}"] + part)


def _order_free(ctx, graph, s: Strategy, placement) -> frozenset:
    """``{"ep"}`` when every EP collective of the plan is a direct all-to-all (NCCL's choice for its
    size and communicator; skewed dispatches run as all-to-all-v, also direct) or DeepEP's kernels
    (which see their ranks by node, :mod:`.deepep`)."""

    if s.ep <= 1:
        return frozenset({"ep"})
    constants = ctx.collective_constants or DEFAULT
    for phase in ("decode",) if ctx.workload.phase == "decode" else ("prefill", "decode"):
        for prog in build_programs(ctx, s, phase):
            n, per = group_shape(graph, placement.groups("ep", prog.stage)[0])
            for op in prog.ops:
                if op.group != "ep" or op.size_bytes <= 0 or deepep_mode(op) is not None:
                    continue
                shape = make_shape(op.size_bytes, n, per, ctx.cluster.fabric)
                algo = resolve(op.collective, shape, ctx.cluster.fabric, "auto", "auto", constants)[0]
                if op.collective != "all_to_all" or algo != "direct":
                    return frozenset()
    return frozenset({"ep"})


def _expert_load(ctx: CostContext, s: Strategy, cfg, tokens: float) -> float:
    m = ctx.model
    if not m.is_moe or s.ep <= 1:
        return 1.0
    loads = rank_loads(cfg.routing, m.num_experts, s.ep, tokens * s.ep * m.top_k, cfg.seed)
    return float(np.max(loads))


def _window(finish: list[list[float]], phase: str, steps: int) -> tuple[float, int, float, float]:
    if phase == "decode":
        periods = steps // 2
        a, b = max(finish[steps - 1 - periods]), max(finish[steps - 1])
        return (b - a) / periods, periods, a, b
    return max(finish[0]), 1, 0.0, max(finish[0])


def run_folded(ctx, graph, s: Strategy, cfg, phase: str, context=None) -> Phase:
    tokens = tokens_per_rank(ctx, s, phase)
    load = _expert_load(ctx, s, cfg, tokens)
    programs = build_programs(ctx, s, phase, context, load)
    env = simpy.Environment()
    network, analytic = None, []
    placement = placement_of(graph, s, cfg.placement)
    if cfg.contention:
        network = _network(env, graph, cfg, cfg.trace)
        exchanges = FoldedExchanges(ctx, graph, tokens, load)  # MoE exchanges priced as DeepEP's kernels
        programs = reprice_programs(ctx, programs, placement, graph, exchanges)
        comm = FlowComm(network, placement, ctx.collective_constants, ctx.cluster.fabric, cfg.representative,
                        exchanges, direct_kinds(ctx))
    else:
        comm = AnalyticComm()
    ex = Executor(env, programs, comm, cfg.overlap)
    steps = cfg.decode_steps if phase == "decode" else 1
    finish = ex.run_pipeline(s.microbatches, steps)
    step_time, periods, a, b = _window(finish, phase, steps)
    if cfg.trace:
        analytic = _folded_analytic(ex.intervals, programs, placement, comm if cfg.contention else None)
    lanes = [Lane(p, p, 0, [], placement.stage_gpus(p)) for p in range(s.pp)]
    return Phase(step_time, ex.intervals, (a, b), periods, network.events_processed if network else 0,
                 network.link_bytes if network else {}, network.utilization() if network and cfg.trace else {},
                 lanes, analytic)


def _folded_analytic(intervals, programs, placement, comm) -> list:
    """Collectives of a folded run that took their idle-fabric cost: every communicator of the stage."""
    ops = {(p.stage, op.name, op.layer): op for p in programs for op in p.ops if op.is_comm}
    out = []
    for iv in intervals:
        if iv.stream != "comm":
            continue
        op = ops.get((iv.stage, iv.name, iv.layer))
        if op is None or (comm is not None and comm.contended(op.group, iv.stage)):
            continue
        for ranks in placement.groups(op.group, iv.stage):
            out.append((ranks, op.collective, op.size_bytes, iv.start, iv.end))
    return out


def run_per_gpu(ctx, graph, s: Strategy, cfg, phase: str, context=None,
                orbits: dict[str, list[int]] | None = None) -> Phase:
    env = simpy.Environment()
    network = _network(env, graph, cfg, cfg.trace)
    placement = placement_of(graph, s, cfg.placement)
    lanes = build_lanes(placement, orbits)
    work = RankPrograms(ctx, s, phase, context, cfg)
    steps = cfg.decode_steps if phase == "decode" else 1
    cache: dict[tuple[int, int], list] = {}
    programs = []
    for step in range(steps if work.step_dependent else 1):
        row = []
        for lane in lanes:
            if (lane.e, step) not in cache:
                cache[(lane.e, step)] = work.programs(lane.e, step)
            row.append(cache[(lane.e, step)][lane.stage])
        programs.append(row)
    moe = ctx.model.is_moe and s.ep > 1
    comm = LaneComm(env, ctx, graph, placement, lanes, network, work if moe else None,
                    analytic_only=not cfg.contention, record=cfg.trace)
    ex = LaneExecutor(env, lanes, programs, comm, cfg.overlap)
    finish = ex.run_pipeline(s.microbatches, steps)
    step_time, periods, a, b = _window(finish, phase, steps)
    return Phase(step_time, ex.intervals, (a, b), periods, network.events_processed, network.link_bytes,
                 network.utilization() if cfg.trace else {}, lanes, comm.analytic_log, comm.flows_run)
