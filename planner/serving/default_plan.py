"""The plan ``shard-sim workload=serving`` simulates when none is given: the smallest one that serves the load.

Without ``plan=FILE`` or ``serving.plan.*``, a serving run would simulate ``serving.plan``'s defaults,
one GPU with tensor parallelism 1, which holds neither a 70B model nor the default scenario's
DeepSeek-V3: the first run would answer "infeasible". :func:`default_plan` picks instead one worker of
the smallest aggregated layout whose weights leave KV cache for the configured load, walking the
layouts fewest GPUs first (:func:`candidate_layouts`: tensor parallelism in powers of two up to a node,
then expert parallelism for an MoE model, then pipeline stages). The load is the requests in flight at
once: the closed loop's clients, or, for a rate or a trace, the arrival rate times one request's unloaded
time on that layout (Little's law), at most ``max_num_seqs``; each must hold its prompt and output
(:func:`~simcore.serving.kvcache.kv_capacity_tokens` in blocks, as :class:`~simcore.serving.kvcache.KvCache`
pages them). Where no layout of the cluster holds them all, the smallest that holds one request serves.
"""

from __future__ import annotations

import math

from planner.errors import UserError
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import bit, structural_reasons
from simcore.serving import (
    GroupBatch,
    Pool,
    ServingConfig,
    ServingPlan,
    StepCost,
    read_trace,
    runtime_strategy,
)
from simcore.serving.kvcache import KvCache, kv_capacity_tokens, state_blocks
from simcore.space.bounds import powers_of_two

__all__ = ["default_plan", "candidate_layouts"]


def candidate_layouts(ctx: CostContext) -> list[tuple[int, int, int]]:
    """Worker layouts ``(tp, ep, pp)`` that split the model and fit the cluster (the structural checks of
    :func:`simcore.cost.memory.structural_reasons`), fewest GPUs first; at equal GPUs the widest tensor
    parallelism (powers of two up to a node), then expert parallelism (MoE only), then pipeline stages."""
    n, m = ctx.cluster.num_gpus, ctx.model
    tps = powers_of_two(min(n, max(ctx.cluster.nvlink_domain_size, 8)))
    eps = powers_of_two(min(n, m.num_experts)) if m.is_moe else (1,)
    pps = powers_of_two(min(n, m.num_layers))
    rows = sorted(((t, e, p) for t in tps for e in eps for p in pps if t * e * p <= n),
                  key=lambda x: (x[0] * x[1] * x[2], -x[0], x[2], x[1]))
    strategies = [runtime_strategy(tp=t, ep=e, pp=p).replace(batch=e) for t, e, p in rows]
    reasons = structural_reasons(ctx, StrategyArrays.from_strategies(strategies)) & ~bit("device_count")
    return [row for row, r in zip(rows, reasons.tolist(), strict=True) if r == 0]


def _unloaded_s(ctx: CostContext, strategy, runtime, isl: int, osl: int) -> float:
    """One request alone on ``strategy``: its prefill, then one decode step per further token."""
    cost = StepCost(ctx, strategy, runtime)
    prefill = sum(cost.stage_times([GroupBatch.of([(isl, 0)], [], 1)])[0])
    decode = sum(cost.stage_times([GroupBatch.of([], [isl + osl // 2], 1)])[0])
    return prefill + (osl - 1) * decode


def _in_flight(ctx: CostContext, scfg: ServingConfig, strategy, runtime) -> tuple[int, str]:
    """Requests the load keeps in flight at once on ``strategy``, and the load in words."""
    if scfg.arrival == "closed":
        return scfg.concurrency, f"{scfg.concurrency} clients"
    if scfg.arrival == "poisson":
        rate, label = scfg.rate, f"{scfg.rate:g} req/s"
    else:
        rows = read_trace(scfg.trace)[: scfg.num_requests]
        span = rows[-1][0] - rows[0][0]
        if span <= 0:
            return len(rows), f"the trace's {len(rows)} requests at once"
        rate, label = len(rows) / span, f"the trace's {len(rows) / span:.3g} req/s"
    isl, osl = int(scfg.input_len.mean), int(scfg.output_len.mean)
    n = max(math.ceil(rate * _unloaded_s(ctx, strategy, runtime, isl, osl)), 1)
    return n, f"{label} (~{n} in flight)"


def _room(ctx: CostContext, scfg: ServingConfig, layout, runtime) -> tuple[int, int, int, str]:
    """``(requests its KV holds, requests in flight, KV tokens per attention group, the load in words)``;
    ``(0, 1, 0, "")`` when its weights leave no KV cache."""
    strategy = runtime_strategy(tp=layout[0], ep=layout[1], pp=layout[2])
    kv = kv_capacity_tokens(ctx, strategy, runtime)
    if kv <= 0:
        return 0, 1, 0, ""
    cache = KvCache(kv, runtime.kv_block_tokens, state_blocks(ctx, strategy, runtime.kv_block_tokens))
    one = cache.blocks_alone(int(scfg.input_len.mean) + int(scfg.output_len.mean))
    held = layout[1] * (cache.total_blocks // one)  # each of the ep attention groups has its own cache
    load, words = _in_flight(ctx, scfg, strategy, runtime)
    return held, load, kv, words


def default_plan(ctx: CostContext, scfg: ServingConfig, max_num_seqs: int = 256) -> tuple[ServingPlan, str]:
    """One worker of the smallest aggregated layout whose KV holds the load (module docstring), else of
    the one holding most of it, and why, in one line; :class:`~planner.errors.UserError` when no layout
    holds one request."""
    runtime = scfg.runtime_profile()
    smaller, best = None, None  # the preferred layout of the largest size that fell short; the roomiest
    for layout in candidate_layouts(ctx):
        held, load, kv, words = _room(ctx, scfg, layout, runtime)
        wanted = min(load, max_num_seqs)
        capped = f", at most max_num_seqs {max_num_seqs} of them running" if wanted < load else ""
        if held >= wanted:
            why = (f"the smallest aggregated layout whose weights leave KV for {words}{capped} ({kv:,} tokens per "
                   f"attention group) on {ctx.cluster.gpu.name}")
            return _plan(layout, max_num_seqs), _why(ctx, layout, smaller, why)
        if best is None or held > best[1]:
            best = (layout, held, f"the aggregated layout whose weights leave the most KV on {ctx.cluster.gpu.name}: "
                                  f"for {held} of the {wanted} requests in flight ({words}{capped}); none of up to "
                                  f"{ctx.cluster.num_gpus} GPUs holds them all")
        if smaller is None or _gpus(layout) > _gpus(smaller[0]):
            smaller = (layout, held)
    if best is not None and best[1] > 0:
        return _plan(best[0], max_num_seqs), _why(ctx, best[0], None, best[2])
    total = int(scfg.input_len.mean) + int(scfg.output_len.mean)
    raise UserError(f"serving.plan: no aggregated layout of up to {ctx.cluster.num_gpus} {ctx.cluster.gpu.name} "
                    f"GPUs holds {ctx.model.name}'s weights and the KV of one {total}-token request")


def _gpus(layout) -> int:
    return layout[0] * layout[1] * layout[2]


def _plan(layout, max_num_seqs: int) -> ServingPlan:
    return ServingPlan("agg", pool=Pool(runtime_strategy(tp=layout[0], ep=layout[1], pp=layout[2]), 1, max_num_seqs))


def _gpus_text(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _why(ctx: CostContext, layout, smaller, why: str) -> str:
    """The line ``shard-sim`` prints: the layout, ``why``, what the largest smaller layout lacks."""
    t, e, p = layout
    below = ""
    if smaller is not None:
        (st, se, sp), held = smaller
        below = (f"; tp{st} ep{se} pp{sp} ({_gpus_text(_gpus(smaller[0]))}) "
                 f"{'leaves no KV cache' if not held else f'holds {held} requests'}")
    return (f"no plan given: simulating one worker of tp{t} ep{e} pp{p} ({_gpus_text(t * e * p)} of "
            f"{ctx.cluster.num_gpus}), {why}{below}; choose a plan with plan=FILE or serving.plan.*")
