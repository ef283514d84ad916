"""The roofline proxy: a strategy's step time, latency and throughput from the lowered tasks.

The proxy is the simulator with contention and overlap switched off: it sums the same task costs
(:mod:`simcore.cost.lowering`) along each pipeline stage and composes the stages in closed form:

- prefill of ``mb`` microbatches through ``pp`` stages: ``sum(stage) + (mb - 1) * max(stage)``;
- one decode step of every sequence: ``max(mb * max(stage), sum(stage))`` (a microbatch cannot start
  its next token before its previous one left the last stage);
- ``static``: prefill, then ``output_len`` decode steps whose context grows; the decode total is the
  midpoint rule over ``STATIC_SAMPLES`` equal segments of the output (the step cost is piecewise
  linear in context, so the error is bounded by the kinks; ``tests/test_proxy.py`` bounds it).

The host's time per step (:mod:`simcore.cost.host`) is charged once per step, a prefill pass or a decode
step of every microbatch: ``step + host`` for a synchronous runtime, ``max(step, host)`` for an
overlapped one; an eager runtime's stage takes at least its kernels times its launch cost.

MoE skew: with a routing config on the context (``ctx.routing``), every MoE layer is priced at the
expected load of its busiest expert rank under that routing (:func:`simcore.moe.expected_max_load`,
with the strategy's redundant experts), so a search sees skew and what replicas buy back.

:func:`evaluate_batch` prices arrays of strategies; :func:`evaluate` prices one and adds the
per-operator and per-category breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simcore.cost.host import launch_floor, with_host
from simcore.cost.lowering import CostContext, StrategyArrays, Task, lower
from simcore.cost.memory import bit, memory_per_gpu_bytes, reason_names, stage_layers, structural_reasons
from simcore.moe import expected_max_loads
from simcore.strategy.sharding import Strategy

__all__ = ["BatchResult", "ProxyResult", "evaluate_batch", "evaluate", "STATIC_SAMPLES"]

STATIC_SAMPLES = 4


@dataclass
class BatchResult:
    """One entry per strategy. Invalid strategies keep their (finite) costs and a non-zero mask."""

    step_time_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    tokens_per_s: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    memory_per_gpu_bytes: np.ndarray
    reasons: np.ndarray

    @property
    def valid(self) -> np.ndarray:
        return self.reasons == 0


@dataclass
class ProxyResult:
    """One strategy, with its breakdown of the step (seconds, summing to ``step_time_s``)."""

    strategy: Strategy
    valid: bool
    reasons: list[str]
    step_time_s: float
    ttft_s: float
    tpot_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    memory_per_gpu_bytes: float
    by_operator: dict[str, float] = field(default_factory=dict)
    by_category: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"strategy": self.strategy.to_dict(), "valid": self.valid, "reasons": self.reasons,
                "step_time_s": self.step_time_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "memory_per_gpu_bytes": self.memory_per_gpu_bytes,
                "by_operator": self.by_operator, "by_category": self.by_category}


def _block_time(tasks: list[Task]) -> np.ndarray:
    return sum(task.time_s * task.count for task in tasks)


def _stage_counts(ctx: CostContext, s: StrategyArrays) -> dict[str, np.ndarray]:
    """How many times each block runs on each stage, shape ``[n, max(pp)]``."""
    dense, moe, in_stage = stage_layers(ctx.model, s.pp)
    stages = np.arange(dense.shape[1])[None, :]
    last = (s.pp - 1)[:, None]
    return {"dense_layer": dense, "moe_layer": moe, "first": (stages == 0) & in_stage,
            "last": stages == last, "p2p": (stages < last) & in_stage}


def _stage_times(blocks: dict[str, list[Task]], counts: dict[str, np.ndarray], launch_s: float = 0.0) -> np.ndarray:
    total, kernels = 0.0, 0.0
    for name, tasks in blocks.items():
        total = total + counts[name] * _block_time(tasks)[:, None]
        if launch_s > 0:  # kernels a stage launches per microbatch (tasks that cost something)
            kernels = kernels + counts[name] * sum(t.count * (t.time_s > 0) for t in tasks)[:, None]
    return launch_floor(total, kernels, launch_s)


def _expert_load(ctx: CostContext, s: StrategyArrays, phase: str):
    """The busiest expert rank's expected load under ``ctx.routing`` (1.0 without one)."""
    m = ctx.model
    if ctx.routing is None or not m.is_moe:
        return 1.0

    tokens = s.batch / (s.ep * s.microbatches) * (ctx.workload.input_len if phase == "prefill" else 1)
    return expected_max_loads(ctx.routing, m.num_experts, s.ep, tokens * s.ep * m.top_k, s.redundant)


def _phase(ctx, s, counts, phase: str, context=None):
    blocks = lower(ctx, s, phase, context, _expert_load(ctx, s, phase))
    stage = _stage_times(blocks, counts, ctx.workload.launch_s)
    mb = s.microbatches
    if phase == "prefill":
        gpu = stage.sum(axis=1) + (mb - 1) * stage.max(axis=1)
    else:
        gpu = np.maximum(mb * stage.max(axis=1), stage.sum(axis=1))
    return with_host(gpu, ctx.cluster.gpu.iteration_overhead_s, ctx.workload.host_overlap), stage, blocks


def _static_contexts(w) -> np.ndarray:
    seg = w.output_len / STATIC_SAMPLES
    return w.input_len + (np.arange(STATIC_SAMPLES) + 0.5) * seg - 0.5


def _evaluate(ctx: CostContext, s: StrategyArrays) -> tuple[BatchResult, list[tuple]]:
    """Price every strategy; also return each phase's ``(phase, weight, time, stage, blocks, counts)``."""
    w = ctx.workload
    counts = _stage_counts(ctx, s)
    nan = np.full(len(s), np.nan)
    phases = []
    if w.phase == "decode":
        step, stage, blocks = _phase(ctx, s, counts, "decode")
        phases.append(("decode", 1.0, step, stage, blocks))
        ttft, tpot, tokens = nan, step, s.batch * 1.0
    else:
        prefill, stage, blocks = _phase(ctx, s, counts, "prefill")
        phases.append(("prefill", 1.0, prefill, stage, blocks))
        if w.phase == "prefill":
            step, ttft, tpot, tokens = prefill, prefill, nan, s.batch * float(w.input_len)
        else:
            weight = w.output_len / STATIC_SAMPLES
            decode = 0.0
            for c in _static_contexts(w):
                time, stage, blocks = _phase(ctx, s, counts, "decode", c)
                phases.append(("decode", weight, time, stage, blocks))
                decode = decode + time * weight
            step, ttft, tpot = prefill + decode, prefill, decode / w.output_len
            tokens = s.batch * float(w.output_len)
    tokens_per_s = s.dp * tokens / step
    gpus = s.tp * s.ep * s.pp * s.dp
    memory = memory_per_gpu_bytes(ctx, s)
    mask = structural_reasons(ctx, s)
    mask |= np.where(memory > ctx.cluster.gpu.usable_hbm_bytes, bit("hbm_capacity"), 0)
    if w.ttft_slo_s is not None:
        mask |= np.where(np.nan_to_num(ttft, nan=0.0) > w.ttft_slo_s, bit("ttft_slo"), 0)
    if w.tpot_slo_s is not None:
        mask |= np.where(np.nan_to_num(tpot, nan=0.0) > w.tpot_slo_s, bit("tpot_slo"), 0)
    result = BatchResult(step, ttft, tpot, tokens_per_s, tokens_per_s / gpus, memory, mask)
    return result, [(*p, counts) for p in phases]


def evaluate_batch(ctx: CostContext, strategies) -> BatchResult:
    """Price many strategies at once (a list of :class:`Strategy` or a :class:`StrategyArrays`)."""
    s = strategies if isinstance(strategies, StrategyArrays) else StrategyArrays.from_strategies(strategies)
    return _evaluate(ctx, s)[0]


def _breakdown(phases, mb: int) -> tuple[dict[str, float], dict[str, float]]:
    """Critical-stage tasks of each phase (times microbatches), its bubble and its host time (what the
    host adds to the step beyond the GPU's), weighted; one strategy."""
    by_op: dict[str, float] = {}
    by_cat: dict[str, float] = {}
    for phase_name, weight, time, stage, blocks, counts in phases:
        prefill = phase_name == "prefill"
        crit = int(np.argmax(stage[0]))
        for name, tasks in blocks.items():
            n = float(counts[name][0, crit]) * mb * weight
            for task in tasks:
                t = float(task.time_s[0]) * task.count * n
                if t == 0.0:
                    continue
                by_op[task.op] = by_op.get(task.op, 0.0) + t
                cat = f"comm:{task.group}" if task.is_comm else "compute"
                by_cat[cat] = by_cat.get(cat, 0.0) + t
        gpu = float(stage[0].sum()) + (mb - 1) * float(stage[0, crit]) if prefill else \
            max(mb * float(stage[0, crit]), float(stage[0].sum()))
        host = float(time[0]) - gpu
        by_op["host"] = by_op.get("host", 0.0) + host * weight
        by_cat["host"] = by_cat.get("host", 0.0) + host * weight
        by_cat["bubble"] = by_cat.get("bubble", 0.0) + (gpu - mb * float(stage[0, crit])) * weight
    return by_op, by_cat


def evaluate(ctx: CostContext, strategy: Strategy) -> ProxyResult:
    """Price one strategy, with the step broken down by operator and by category."""
    s = StrategyArrays.from_strategies([strategy])
    r, phases = _evaluate(ctx, s)
    by_op, by_cat = _breakdown(phases, strategy.microbatches)
    mask = int(r.reasons[0])
    return ProxyResult(strategy, mask == 0, reason_names(mask), float(r.step_time_s[0]), float(r.ttft_s[0]),
                       float(r.tpot_s[0]), float(r.tokens_per_s[0]), float(r.tokens_per_s_per_gpu[0]),
                       float(r.memory_per_gpu_bytes[0]), by_op, by_cat)
