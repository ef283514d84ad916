"""The exact optimum under the proxy: exhaustive over the degree grid, exact over operator choices.

Enumerating ``3^k`` operator choices per degree row is ``1.3e9`` proxy evaluations for DeepSeek-V3
(``k = 12``), about four hours. This module finds the same optimum with ~10^6 by using the structure of
the proxy.

**Structure.** Split the operators into the *condition* ``C = (qkv, attention, out_proj)`` and the
groups ``E = (embedding)``, ``H = (lm_head)``, ``D = (dense_ffn1, dense_ffn2)`` and
``M = (router, shared_ffn1, shared_ffn2, expert_ffn1, expert_ffn2)`` (operators the model lacks are
dropped; their choice changes nothing). In :mod:`simcore.cost.lowering` every task of a block reads the
choices of one operator or of two consecutive ones, and the blocks chain through ``qkv``'s input
layout, so for a fixed degree row and a fixed ``c`` in ``C``:

1. the ``first`` block depends on ``E`` only, ``last`` on ``H`` only, a dense layer on ``D`` only and
   an MoE layer on ``M`` only; ``p2p`` on none. Write ``T_g(x)`` for the time of group ``g``'s block
   under its choice ``x``. Block times depend on the degrees only through ``tp``, ``ep`` and the
   sequences per attention group and microbatch ``batch / (ep * microbatches)``;
2. each stage's time is a non-negative combination of block times (layer counts, first/last flags),
   and the step is ``sum + (mb - 1) * max`` (prefill) or ``max(mb * max, sum)`` (decode) of stage
   times: non-decreasing in every ``T_g``. Throughput at a fixed row is ``dp * tokens / step``:
   decreasing in the step. The SLO bounds the step (TTFT for prefill, TPOT for decode);
3. each stage's memory is a non-negative combination of the groups' weight bytes ``W_g(x)`` (layer
   counts, first/last stage) plus terms ``x`` does not change (``C``'s weights, KV cache, activations);
4. divisibility validity is a conjunction of per-operator conditions plus row-level ones.

**Claim.** For fixed row and ``c``, if ``x`` dominates ``y`` in group ``g`` (``T_g(x) <= T_g(y)`` and
``W_g(x) <= W_g(y)``, both divisible) then replacing ``y`` by ``x`` in any strategy cannot lower its
throughput (2) nor break a memory (3), SLO (2) or divisibility (4) limit. By induction over the groups,
some optimal strategy uses a Pareto-optimal choice in every group: the product of the groups' Pareto
sets contains an optimum. **Pruning.** The strategy taking each group's fastest choice has the
smallest step of all strategies of ``(row, c)`` (2), so its throughput bounds theirs from above; if it
is valid it is optimal for ``(row, c)``, if it breaks the SLO all of them do, and if it only breaks
memory the Pareto product of ``(row, c)`` is searched unless the bound cannot beat the best valid
value found. Every candidate is finally priced by :func:`simcore.cost.proxy.evaluate_batch` at its true
row, so the answer is the proxy's own number.

**Redundant experts.** A row here is a degree row plus one of the space's redundant-experts options
at its ``ep`` (``SearchSpace.with_redundant``; only 0 when the space offers none). The replicas change
the MoE block's time (the busiest rank's expected load, the expert slots) and its expert weights, the
same for every choice, so everything above holds per row with them.

``T_g`` is measured by probes: strategies with ``pp = 1`` and one microbatch at the row's ``tp``,
``ep``, sequences per group and redundant experts, every other group replicated. There the step is
the sum of the blocks, so for fixed ``c`` the probe steps differ exactly by ``T_g`` differences.
``tests/test_exact.py`` checks the result against brute force. The static workload composes several phases whose block times
a scalar probe cannot separate: it falls back to brute force when the space is small enough.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from planner.actions import row_reasons
from planner.megatron import BASE_WIDTH, KEY_WIDTH
from planner.space import SearchSpace
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import bit
from simcore.cost.proxy import BatchResult, evaluate_batch
from simcore.strategy.opgraph import REPLICATED, SEARCHABLE_OPS, choice_code, model_ops, op_applies
from simcore.strategy.sharding import megatron_sharding

__all__ = ["ExactResult", "exact_optimum", "brute_force", "GROUPS", "CONDITION"]

CONDITION = ("qkv", "attention", "out_proj")
GROUPS = {"first": ("embedding",), "last": ("lm_head",), "dense": ("dense_ffn1", "dense_ffn2"),
          "moe": ("router", "shared_ffn1", "shared_ffn2", "expert_ffn1", "expert_ffn2")}
_CHOICE_BITS = bit("heads_divisibility") | bit("feature_divisibility")
_SLO_BITS = bit("ttft_slo") | bit("tpot_slo")
_CHUNK = 100_000


@dataclass
class ExactResult:
    """The optimum (``key`` of ``Strategy.key()`` layout, ``None`` when nothing is valid), its proxy
    throughput, the number of strategies priced, and every strategy priced at its true row."""

    key: tuple | None
    tokens_per_s_per_gpu: float
    calls: int
    keys: np.ndarray
    values: np.ndarray
    reasons: np.ndarray


def _price(ctx: CostContext, keys: np.ndarray) -> BatchResult:
    parts = [evaluate_batch(ctx, StrategyArrays.from_keys(keys[i: i + _CHUNK])) for i in range(0, len(keys), _CHUNK)]
    if not parts:
        return BatchResult(*(np.zeros(0, dtype=np.int64 if f == "reasons" else float)
                             for f in BatchResult.__dataclass_fields__))
    return BatchResult(*(np.concatenate([getattr(p, f) for p in parts]) for f in BatchResult.__dataclass_fields__))


def _base_codes(ops: tuple[str, ...]) -> np.ndarray:
    """Replicated for the model's operators (never a divisibility fault), Megatron's for the rest."""
    meg = megatron_sharding()
    return np.array([REPLICATED if op in ops else choice_code(meg[op]) for op in SEARCHABLE_OPS], dtype=np.int64)


def _rows(ctx: CostContext, space: SearchSpace) -> np.ndarray:
    """Rows ``(tp, ep, pp, dp, batch, microbatches, redundant)`` of the space that pass the structural
    checks with every operator replicated (so no choice is at fault)."""
    rows = space.with_redundant(space.degree_grid())
    return rows[row_reasons(ctx, rows) == 0]


def _probe_keys(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique ``(tp, ep, sequences per group and microbatch, redundant)`` of rows, and each row's index."""
    seqs = rows[:, 4] // (rows[:, 1] * rows[:, 5])
    return np.unique(np.stack([rows[:, 0], rows[:, 1], seqs, rows[:, 6]], 1), axis=0, return_inverse=True)


class _Probe:
    """Group block times ``T[g][key, c, x]`` and weights ``W[g][key, x]`` for the unique probe keys
    ``(tp, ep, sequences per group, redundant experts)``."""

    def __init__(self, ctx: CostContext, probe_keys: np.ndarray, ops: tuple[str, ...]):
        self.ctx, self.ops = ctx, ops
        self.groups = {g: tuple(o for o in members if o in ops) for g, members in GROUPS.items()}
        self.groups = {g: m for g, m in self.groups.items() if m}
        self.conds = np.array(list(itertools.product(range(3), repeat=3)), dtype=np.int64)
        self.choices = {g: np.array(list(itertools.product(range(3), repeat=len(m))), dtype=np.int64)
                        for g, m in self.groups.items()}
        base = _base_codes(ops)
        self.T, self.W, self.calls = {}, {}, 0
        n_k, n_c = len(probe_keys), len(self.conds)
        for g, members in self.groups.items():
            x = self.choices[g]
            grid = np.array(list(itertools.product(range(n_k), range(n_c), range(len(x)))), dtype=np.int64)
            keys = np.empty((len(grid), KEY_WIDTH), dtype=np.int64)
            tp, ep, seqs, redundant = probe_keys[grid[:, 0]].T
            keys[:, :6] = np.stack([tp, ep, np.ones_like(tp), np.ones_like(tp), seqs * ep, np.ones_like(tp)], 1)
            keys[:, 6:BASE_WIDTH] = base
            keys[:, BASE_WIDTH] = redundant
            for j, op in enumerate(CONDITION):
                keys[:, 6 + SEARCHABLE_OPS.index(op)] = self.conds[grid[:, 1], j]
            for j, op in enumerate(members):
                keys[:, 6 + SEARCHABLE_OPS.index(op)] = x[grid[:, 2], j]
            r = _price(ctx, keys)
            self.calls += len(keys)
            t = np.where((r.reasons & _CHOICE_BITS) == 0, r.step_time_s, np.inf)
            self.T[g] = t.reshape(n_k, n_c, len(x))
            self.W[g] = np.stack([self._weights(members, x, int(k[0]), int(k[1]), int(k[3])) for k in probe_keys])

    def _weights(self, members, x: np.ndarray, tp: int, ep: int, redundant: int = 0) -> np.ndarray:
        """Weight bytes per GPU of one layer's (or block's) group operators under each choice (an
        expert operator's: its slots per GPU, as :func:`simcore.cost.memory.memory_per_gpu_bytes` counts)."""
        m, w = self.ctx.model, self.ctx.workload
        ops, wb = model_ops(m), w.weight_bytes
        slots = np.ceil((m.num_experts + redundant) / max(ep, 1)) / max(m.num_experts, 1)
        total = np.zeros(len(x))
        for j, op in enumerate(members):
            per = ops[op].weight_params * wb / np.where(x[:, j] == REPLICATED, 1.0, tp)
            total += per * (w.expert_bytes / wb) * slots if op.startswith("expert_") else per
        return total

    def pareto(self, g: str) -> tuple[np.ndarray, np.ndarray]:
        """Choices of group ``g`` sorted by (time, weights, index) and which are Pareto-optimal,
        both ``[key, c, x]``; invalid choices sort last and are never kept."""
        t = self.T[g]
        w = np.broadcast_to(self.W[g][:, None, :], t.shape)
        order = np.lexsort((w, t), axis=-1)
        ts, ws = np.take_along_axis(t, order, -1), np.take_along_axis(w, order, -1)
        prev = np.concatenate([np.full(ws.shape[:-1] + (1,), np.inf), np.minimum.accumulate(ws, -1)[..., :-1]], -1)
        return order, (ws < prev) & np.isfinite(ts)


def _assemble(rows: np.ndarray, conds: np.ndarray, picks: dict, probe: _Probe, base: np.ndarray) -> np.ndarray:
    """Keys of rows ``[n, 7]`` (degrees, redundant experts) with condition ``conds`` and group picks."""
    keys = np.empty((len(rows), KEY_WIDTH), dtype=np.int64)
    keys[:, :6], keys[:, 6:BASE_WIDTH], keys[:, BASE_WIDTH] = rows[:, :6], base, rows[:, 6]
    for j, op in enumerate(CONDITION):
        keys[:, 6 + SEARCHABLE_OPS.index(op)] = conds[:, j]
    for g, x in picks.items():
        for j, op in enumerate(probe.groups[g]):
            keys[:, 6 + SEARCHABLE_OPS.index(op)] = probe.choices[g][x, j]
    return keys


def exact_optimum(ctx: CostContext, space: SearchSpace, brute_force_limit: int = 3_000_000) -> ExactResult:
    """The proxy's best strategy over ``space`` (every degree row, every operator choice)."""
    ops = tuple(op for op in SEARCHABLE_OPS if op_applies(ctx.model, op))
    if ctx.workload.phase == "static":
        return brute_force(ctx, space, limit=brute_force_limit)
    rows = _rows(ctx, space)
    if len(rows) == 0:
        return brute_force(ctx, space, limit=brute_force_limit)
    probe_keys, inverse = _probe_keys(rows)
    probe = _Probe(ctx, probe_keys, ops)
    base = _base_codes(ops)
    pareto = {g: probe.pareto(g) for g in probe.groups}
    n_c = len(probe.conds)
    ri, ci = np.repeat(np.arange(len(rows)), n_c), np.tile(np.arange(n_c), len(rows))
    fast = {g: order[inverse[ri], ci, 0] for g, (order, _) in pareto.items()}
    ok = np.all([keep[inverse[ri], ci, 0] for _, keep in pareto.values()], axis=0)
    ri, ci, fast = ri[ok], ci[ok], {g: x[ok] for g, x in fast.items()}
    keys = _assemble(rows[ri], probe.conds[ci], fast, probe, base)
    result = _price(ctx, keys)
    seen_keys, seen_vals, seen_reasons = [keys], [result.tokens_per_s_per_gpu], [result.reasons]
    best = np.where(result.valid, result.tokens_per_s_per_gpu, -np.inf).max(initial=-np.inf)
    pending = np.flatnonzero(result.reasons == bit("hbm_capacity"))
    pending = pending[np.argsort(-result.tokens_per_s_per_gpu[pending], kind="stable")]
    bound = result.tokens_per_s_per_gpu[pending]
    start = 0
    while start < len(pending):
        batch, size = [], 0
        while start < len(pending) and size < 20_000:
            if bound[start] > best:
                p = pending[start]
                k, c = inverse[ri[p]], ci[p]
                lists = {g: order[k, c][keep[k, c]] for g, (order, keep) in pareto.items()}
                combos = np.array(list(itertools.product(*lists.values())), dtype=np.int64)
                picks = {g: combos[:, j] for j, g in enumerate(lists)}
                batch.append(_assemble(np.repeat(rows[ri[p]][None], len(combos), 0),
                                       np.repeat(probe.conds[c][None], len(combos), 0), picks, probe, base))
                size += len(combos)
            start += 1
        if batch:
            more = np.concatenate(batch)
            r = _price(ctx, more)
            seen_keys.append(more)
            seen_vals.append(r.tokens_per_s_per_gpu)
            seen_reasons.append(r.reasons)
            best = max(best, np.where(r.valid, r.tokens_per_s_per_gpu, -np.inf).max(initial=-np.inf))
    keys, vals, reasons = np.concatenate(seen_keys), np.concatenate(seen_vals), np.concatenate(seen_reasons)
    return _result(keys, vals, reasons, probe.calls + len(keys))


def _result(keys: np.ndarray, vals: np.ndarray, reasons: np.ndarray, calls: int) -> ExactResult:
    score = np.where(reasons == 0, vals, -np.inf)
    if len(score) == 0 or not np.isfinite(score.max()):
        return ExactResult(None, float("nan"), calls, keys, vals, reasons)
    i = int(np.argmax(score))  # first of equals: deterministic
    return ExactResult(tuple(int(v) for v in keys[i]), float(vals[i]), calls, keys, vals, reasons)


def brute_force(ctx: CostContext, space: SearchSpace, limit: int = 3_000_000) -> ExactResult:
    """Every degree row and redundant-experts option (those with ranks to hold the replicas) times
    every choice of the model's operators, priced by the proxy (the reference :func:`exact_optimum`
    is tested against). Refuses spaces above ``limit`` strategies."""
    ops = tuple(op for op in SEARCHABLE_OPS if op_applies(ctx.model, op))
    grid = space.with_redundant(space.degree_grid())
    grid = grid[(grid[:, 6] == 0) | ((row_reasons(ctx, grid) & bit("redundant_experts")) == 0)]
    n = len(grid) * 3 ** len(ops)
    if n > limit:
        raise ValueError(f"planner exact: brute force over {n:,} strategies exceeds the limit of {limit:,} "
                         f"(the fast exact method needs a decode or prefill workload)")
    combos = np.array(list(itertools.product(range(3), repeat=len(ops))), dtype=np.int64)
    base = _base_codes(ops)
    keys = np.empty((len(grid) * len(combos), KEY_WIDTH), dtype=np.int64)
    keys[:, :6] = np.repeat(grid[:, :6], len(combos), 0)
    keys[:, 6:BASE_WIDTH] = base
    keys[:, BASE_WIDTH] = np.repeat(grid[:, 6], len(combos))
    for j, op in enumerate(ops):
        keys[:, 6 + SEARCHABLE_OPS.index(op)] = np.tile(combos[:, j], len(grid))
    r = _price(ctx, keys)
    return _result(keys, r.tokens_per_s_per_gpu, r.reasons, len(keys))

