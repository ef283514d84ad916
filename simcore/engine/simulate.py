"""``simulate``: one strategy's step on the discrete-event simulator.

The step is built from the same lowered tasks as the proxy (:mod:`simcore.engine.program`), runs
on SimPy with per-stage compute and communication streams (:mod:`simcore.engine.executor`), and
its collectives either take their idle-fabric cost or run as flows on the cluster's network
(:mod:`simcore.engine.comm`). With contention and overlap both off it reproduces the proxy.

Scale by symmetry: all GPUs of a pipeline stage run the same program, so the simulator runs one
process per (stage, microbatch), while every concurrent communicator of the stage, in every
replica, puts its flows on the one shared network.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import simpy

from ..lowering import CostContext
from ..proxy import STATIC_SAMPLES, evaluate
from ..strategy import Strategy
from .comm import AnalyticComm, FlowComm
from .executor import Executor
from .placement import Placement
from .program import build_programs
from .result import SimResult, time_split
from .routing import RoutingConfig, rank_loads
from .trace import chrome_trace

__all__ = ["EngineConfig", "simulate"]

_STRUCTURAL = {"device_count", "heads_divisibility", "feature_divisibility", "experts_divisibility",
               "layers", "batch_divisibility"}


@dataclass
class EngineConfig:
    """``contention``: collectives as flows on the network (else idle-fabric costs); ``overlap``:
    separate compute and communication streams; ``decode_steps``: decode passes simulated (the
    step time is the steady period over the last half); ``placement``: pack | spread."""

    contention: bool = True
    overlap: bool = True
    seed: int = 0
    decode_steps: int = 3
    placement: str = "pack"
    trace: bool = False  # keep what a Chrome trace needs (intervals, link utilization timelines)
    representative: bool = True  # one group stands for identical groups that share no link
    routing: RoutingConfig = field(default_factory=RoutingConfig)

    def __post_init__(self) -> None:
        if self.decode_steps < 2:
            raise ValueError(f"engine.decode_steps must be >= 2, got {self.decode_steps}")


@dataclass
class _Phase:
    time_s: float
    intervals: list
    window: tuple[float, float]
    periods: int
    events: int
    link_bytes: dict
    utilization: dict


def _expert_load(ctx: CostContext, s: Strategy, cfg: EngineConfig, tokens: float) -> float:
    m = ctx.model
    if not m.is_moe or s.ep <= 1:
        return 1.0
    loads = rank_loads(cfg.routing, m.num_experts, s.ep, tokens * s.ep * m.top_k, cfg.seed)
    return float(np.max(loads))


def _run_phase(ctx, graph, s: Strategy, cfg: EngineConfig, phase: str, context=None) -> _Phase:
    tokens = s.batch / (s.ep * s.microbatches) * (ctx.workload.input_len if phase == "prefill" else 1)
    programs = build_programs(ctx, s, phase, context, _expert_load(ctx, s, cfg, tokens))
    env = simpy.Environment()
    network = None
    if cfg.contention:
        from ..network import FlowNetwork

        network = FlowNetwork(env, graph, seed=cfg.seed, record=cfg.trace)
        placement = Placement(s, _gpus(graph), int(graph.graph["gpus_per_node"]), cfg.placement)
        comm = FlowComm(network, placement, ctx.collective_constants, ctx.cluster.fabric, cfg.representative)
    else:
        comm = AnalyticComm()
    ex = Executor(env, programs, comm, cfg.overlap)
    steps = cfg.decode_steps if phase == "decode" else 1
    finish = ex.run_pipeline(s.microbatches, steps)
    if phase == "decode":
        periods = steps // 2
        a, b = max(finish[steps - 1 - periods]), max(finish[steps - 1])
        step_time = (b - a) / periods
    else:
        periods, a, b = 1, 0.0, max(finish[0])
        step_time = b
    events = network.events_processed if network is not None else 0
    link_bytes = network.link_bytes if network is not None else {}
    utilization = network.utilization() if network is not None and cfg.trace else {}
    return _Phase(step_time, ex.intervals, (a, b), periods, events, link_bytes, utilization)


def simulate(ctx: CostContext, graph, strategy: Strategy, cfg: EngineConfig | None = None) -> SimResult:
    """Simulate one step of ``strategy``. Invalid strategies come back with their reasons (no
    exception): structural ones are not simulated; memory and SLO are judged on simulated times."""
    cfg = cfg or EngineConfig()
    start = time.perf_counter()
    proxy = evaluate(ctx, strategy)
    structural = [r for r in proxy.reasons if r in _STRUCTURAL]
    result = SimResult(strategy, False, structural, proxy_step_time_s=proxy.step_time_s,
                       proxy_tokens_per_s_per_gpu=proxy.tokens_per_s_per_gpu)
    if structural:
        result.wall_s = time.perf_counter() - start
        return result
    w = ctx.workload
    runs = []
    if w.phase == "decode":
        dec = _run_phase(ctx, graph, strategy, cfg, "decode")
        runs.append((dec, 1.0))
        step, ttft, tpot, tokens = dec.time_s, float("nan"), dec.time_s, float(strategy.batch)
    else:
        pre = _run_phase(ctx, graph, strategy, cfg, "prefill")
        runs.append((pre, 1.0))
        if w.phase == "prefill":
            step, ttft, tpot, tokens = pre.time_s, pre.time_s, float("nan"), float(strategy.batch * w.input_len)
        else:
            seg = w.output_len / STATIC_SAMPLES
            decode = 0.0
            for i in range(STATIC_SAMPLES):
                context = w.input_len + (i + 0.5) * seg - 0.5
                run = _run_phase(ctx, graph, strategy, cfg, "decode", context)
                runs.append((run, seg))
                decode += run.time_s * seg
            step, ttft, tpot = pre.time_s + decode, pre.time_s, decode / w.output_len
            tokens = float(strategy.batch * w.output_len)
    reasons = [r for r in proxy.reasons if r == "hbm_capacity"]
    if w.ttft_slo_s is not None and ttft == ttft and ttft > w.ttft_slo_s:
        reasons.append("ttft_slo")
    if w.tpot_slo_s is not None and tpot == tpot and tpot > w.tpot_slo_s:
        reasons.append("tpot_slo")
    split = []
    for p in range(strategy.pp):
        total: dict[str, float] = {}
        for run, weight in runs:
            part = time_split(run.intervals, p, *run.window, periods=run.periods)
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v * weight
        split.append(total)
    result.valid, result.reasons = not reasons, reasons
    result.step_time_s, result.ttft_s, result.tpot_s = step, ttft, tpot
    result.tokens_per_s = strategy.dp * tokens / step
    result.tokens_per_s_per_gpu = result.tokens_per_s / strategy.gpus
    result.split = split
    result.network_events = sum(run.events for run, _ in runs)
    result.link_utilization = _utilization(graph, runs) if cfg.contention else {}
    if cfg.trace:  # the first phase (the prefill of a static batch, or the decode steps)
        first = runs[0][0]
        placement = Placement(strategy, _gpus(graph), int(graph.graph["gpus_per_node"]), cfg.placement)
        result.stage_gpus = [placement.stage_gpus(p) for p in range(strategy.pp)]
        result.trace = chrome_trace(first.intervals, result.stage_gpus, graph, first.utilization)
    result.wall_s = time.perf_counter() - start
    return result


def _gpus(graph) -> list[str]:
    from topologies import gpu_nodes

    return gpu_nodes(graph)


def _utilization(graph, runs) -> dict[str, float]:
    """Mean utilization of each link that carried traffic, over the simulated phases."""
    busy: dict[tuple, float] = {}
    span = 0.0
    for run, _ in runs:
        span += max((i.end for i in run.intervals), default=0.0)
        for link, nbytes in run.link_bytes.items():
            busy[link] = busy.get(link, 0.0) + nbytes / graph.edges[link]["bandwidth_bytes_per_s"]
    return {f"{u}->{v}": t / span for (u, v), t in sorted(busy.items()) if t > 0 and span > 0}
