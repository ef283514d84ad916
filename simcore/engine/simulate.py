"""``simulate``: one strategy's step on the discrete-event simulator.

The step is built from the same lowered tasks as the proxy (:mod:`simcore.engine.program`), runs
on SimPy with compute and communication streams (:mod:`simcore.engine.executor`), and its
collectives either take their idle-fabric cost (for the communicator's real placement) or run as
flows on the cluster's network. With contention and overlap both off it reproduces the proxy.
The host's time per step (:mod:`simcore.cost.host`) is not a GPU task: each simulated step (a prefill
pass, a decode period of every microbatch) takes ``step + host`` (synchronous runtime) or
``max(step, host)`` (overlapped), the proxy's closed form.

Two modes (:mod:`simcore.engine.phase`): ``per-gpu`` runs every GPU as its own lane (its own
program, streams and rendezvous collectives; lanes merge only along rank axes proven symmetric),
``folded`` runs one process per (stage, microbatch) for all GPUs of the stage, exact only where
placement, fabric and routing are symmetric. ``auto`` folds exactly there and says why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from simcore.cost.host import with_host
from simcore.cost.lowering import CostContext
from simcore.cost.proxy import STATIC_SAMPLES, evaluate
from simcore.engine.phase import choose_mode, placement_of, run_folded, run_per_gpu
from simcore.engine.rank_loads import RoutingConfig
from simcore.engine.result import SimResult, time_split
from simcore.engine.trace import chrome_trace
from simcore.strategy.sharding import Strategy

__all__ = ["EngineConfig", "simulate", "MODES"]

MODES = ("auto", "folded", "per-gpu")
_STRUCTURAL = {"device_count", "heads_divisibility", "feature_divisibility", "experts_divisibility",
               "layers", "batch_divisibility"}


@dataclass
class EngineConfig:
    """``contention``: collectives as flows on the network (else idle-fabric costs); ``overlap``:
    separate compute and communication streams; ``decode_steps``: decode passes simulated (the
    step time is the steady period over the last half); ``placement``: pack | spread; ``mode``:
    auto | folded | per-gpu (see the module docstring); ``share_lanes``: per-gpu lanes may stand
    for GPUs proven identical (false: one lane per GPU, the reference)."""

    contention: bool = True
    overlap: bool = True
    seed: int = 0
    decode_steps: int = 3
    placement: str = "pack"
    trace: bool = False  # keep what a Chrome trace needs (intervals, link utilization timelines)
    representative: bool = True  # folded: one group stands for identical groups that share no link
    mode: str = "auto"
    share_lanes: bool = True
    routing: RoutingConfig = field(default_factory=RoutingConfig)

    def __post_init__(self) -> None:
        if self.decode_steps < 2:
            raise ValueError(f"sim.decode_steps must be >= 2, got {self.decode_steps}")
        if self.mode not in MODES:
            raise ValueError(f"sim.mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"sim.seed must be an integer >= 0, got {self.seed!r}")  # numpy's generators' seeds


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
    mode, why, orbits = choose_mode(ctx, graph, strategy, cfg)
    result.mode, result.mode_reason = mode, why

    def _step(run):  # the host's time, once per simulated step, beside the GPU's (simcore.cost.host)
        return with_host(run.time_s, ctx.cluster.gpu.iteration_overhead_s, w.host_overlap)

    runs, step, ttft, tpot, tokens = _phases(ctx, graph, strategy, cfg, mode, orbits, _step)
    reasons = [r for r in proxy.reasons if r == "hbm_capacity"]
    if w.ttft_slo_s is not None and ttft == ttft and ttft > w.ttft_slo_s:
        reasons.append("ttft_slo")
    if w.tpot_slo_s is not None and tpot == tpot and tpot > w.tpot_slo_s:
        reasons.append("tpot_slo")
    split = _stage_splits(strategy.pp, runs, _step)
    result.valid, result.reasons = not reasons, reasons
    result.step_time_s, result.ttft_s, result.tpot_s = step, ttft, tpot
    result.tokens_per_s = strategy.dp * tokens / step
    result.tokens_per_s_per_gpu = result.tokens_per_s / strategy.gpus
    result.split = split
    result.network_events = sum(run.events for run, _ in runs)
    result.flows_run = sum(run.flows_run for run, _ in runs)
    result.lanes = len(runs[0][0].lanes)
    result.link_utilization = _utilization(graph, runs) if cfg.contention else {}
    placement = placement_of(graph, strategy, cfg.placement)
    result.stage_gpus = [placement.stage_gpus(p) for p in range(strategy.pp)]
    if cfg.trace:  # the first phase (the prefill of a static batch, or the decode steps)
        first = runs[0][0]
        result.trace = chrome_trace(first.intervals, first.lanes, graph, first.utilization, first.analytic,
                                    ctx=ctx, per_gpu=mode == "per-gpu")
    result.wall_s = time.perf_counter() - start
    return result


def _phases(ctx: CostContext, graph, strategy: Strategy, cfg: EngineConfig, mode: str, orbits, step):
    """Simulate the workload's phases: ``(runs, step_s, ttft_s, tpot_s, tokens)``, ``runs`` the
    ``(run, weight)`` of each simulated step (a static batch's decode sampled at ``STATIC_SAMPLES``
    contexts, each weighing its share of the output tokens) and ``step(run)`` one step's time with the host's."""
    w = ctx.workload

    def run_phase(phase, context=None):
        if mode == "folded":
            return run_folded(ctx, graph, strategy, cfg, phase, context)
        return run_per_gpu(ctx, graph, strategy, cfg, phase, context, orbits)

    if w.phase == "decode":
        dec = run_phase("decode")
        return [(dec, 1.0)], step(dec), float("nan"), step(dec), float(strategy.batch)
    pre = run_phase("prefill")
    if w.phase == "prefill":
        return [(pre, 1.0)], step(pre), step(pre), float("nan"), float(strategy.batch * w.input_len)
    runs, seg, decode = [(pre, 1.0)], w.output_len / STATIC_SAMPLES, 0.0
    for i in range(STATIC_SAMPLES):
        run = run_phase("decode", w.input_len + (i + 0.5) * seg - 0.5)
        runs.append((run, seg))
        decode += step(run) * seg
    return runs, step(pre) + decode, step(pre), decode / w.output_len, float(strategy.batch * w.output_len)


def _stage_splits(pp: int, runs, step) -> list[dict[str, float]]:
    """Per stage, the time split of its GPUs (mean over its lanes, weighted by the GPUs each stands
    for), weighted over the phases; ``host``: what the host adds to each step (``step(run)``) beyond
    the GPUs' time."""
    split = [dict.fromkeys(("compute", "exposed_comm", "bubble", "idle", "host"), 0.0) for _ in range(pp)]
    for run, weight in runs:
        for p in range(pp):
            split[p]["host"] += (step(run) - run.time_s) * weight
        by_lane: dict[int, list] = {}
        for iv in run.intervals:
            by_lane.setdefault(iv.stage, []).append(iv)
        gpus = [0] * pp
        parts: list[list] = [[] for _ in range(pp)]
        for lane in run.lanes:
            n = max(len(lane.gpus), 1)
            parts[lane.stage].append((time_split(by_lane.get(lane.index, []), lane.index, *run.window,
                                                 periods=run.periods), n))
            gpus[lane.stage] += n
        for p in range(pp):
            for part, n in parts[p]:
                for k, v in part.items():
                    split[p][k] += v * weight * n / gpus[p]
    return split


def _utilization(graph, runs) -> dict[str, float]:
    """Mean utilization of each link that carried traffic, over the simulated phases."""
    busy: dict[tuple, float] = {}
    span = 0.0
    for run, _ in runs:
        span += max((i.end for i in run.intervals), default=0.0)
        for link, nbytes in run.link_bytes.items():
            busy[link] = busy.get(link, 0.0) + nbytes / graph.edges[link]["bandwidth_bytes_per_s"]
    return {f"{u}->{v}": t / span for (u, v), t in sorted(busy.items()) if t > 0 and span > 0}
