"""The GPU time of one scheduler step: a mixed batch of prefill chunks and decodes, priced by the lowering.

A continuous-batching step runs one forward pass over every token the scheduler picked: the chunks of
prompts being prefilled and one token of each decoding sequence. Everything but attention depends only
on how many tokens pass through the GEMMs and how many sequences sample a token, so those tasks come
from the one lowering (:mod:`simcore.lowering`, the proxy's and the simulator's) and are memoized on
``(tokens, sampled)``; attention depends on each sequence's context and is priced per step with the
same kernel model (:func:`simcore.kernels.attention_time_s`). The memo is exact (a test compares it
with a fresh lowering of the same batch): nothing is interpolated.

With data-parallel attention (``ep`` attention groups, as SGLang's DP attention and DeepSeek's
deployments run) all groups step together through the MoE layers, so a step costs what its busiest
group costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import attention_time_s
from ..lowering import CostContext, StrategyArrays, Task, _Lowerer, attention_dims
from ..memory import stage_layers
from ..opgraph import DIM0, DIM1
from ..strategy import Strategy

__all__ = ["GroupBatch", "StepCost"]


@dataclass
class GroupBatch:
    """What one attention group runs in a step.

    ``chunks``: ``(new_tokens, prior_context)`` of each prompt chunk; ``decode_contexts``: the
    context of each decoding sequence (tokens it attends to, its new one included); ``sampled``:
    sequences that sample a token this step (decodes plus prompts whose last chunk this is).
    """

    chunks: list[tuple[int, int]]
    decode_contexts: list[int]
    sampled: int

    @property
    def tokens(self) -> int:
        return sum(c for c, _ in self.chunks) + len(self.decode_contexts)


class _NoAttention(_Lowerer):
    """The lowering with the attention kernel left out (priced per step by :class:`StepCost`)."""

    def _attention(self) -> Task:
        return Task("attention", "attention", "attention", 0.0)


class StepCost:
    """Per-stage GPU time of a step on one worker running ``strategy`` (``dp`` is ignored: one replica).

    ``stage_times(groups)`` returns one time per pipeline stage, in seconds, for the given per-group
    batches (one :class:`GroupBatch` per attention group, at most ``strategy.ep``).
    """

    def __init__(self, ctx: CostContext, strategy: Strategy):
        self.ctx, self.strategy = ctx, strategy
        self.model, self.gpu, self.w = ctx.model, ctx.cluster.gpu, ctx.workload
        dense, moe, _ = stage_layers(self.model, np.array([strategy.pp]))
        self.dense_layers, self.moe_layers = dense[0].tolist(), moe[0].tolist()
        self._memo: dict[tuple[int, int], tuple[list[float], int]] = {}
        self.lowerings = 0  # how many times the lowering actually ran (the memo's misses)
        tp = strategy.tp
        choice = strategy.choice("attention")
        self._flop_div = tp if choice == DIM1 else 1.0
        kv_shard = 1.0 if self.model.is_mla else min(tp, self.model.num_kv_heads)
        self._byte_div = kv_shard if choice == DIM1 else 1.0
        self._seq_split = tp if choice == DIM0 else 1.0  # sequences split across the TP ranks
        self._kv_layer = self.model.kv_cache_elements_per_token() / self.model.num_layers * self.w.kv_bytes

    # ------------------------------------------------------------------ everything but attention
    def _lowered(self, tokens: int, sampled: int) -> tuple[list[float], int]:
        key = (tokens, sampled)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        self.lowerings += 1
        s = self.strategy
        arrays = StrategyArrays.from_strategies([s.replace(dp=1, batch=s.ep, microbatches=1)])
        low = _NoAttention(self.ctx, arrays, "prefill", self.w.input_len)
        low.tokens, low.seqs = float(max(tokens, 1)), float(max(sampled, 1))
        blocks = {"first": low.first(), "last": low.last(), "p2p": low.p2p()}
        if self.model.num_dense_layers:
            blocks["dense_layer"] = low.layer(moe=False)
        if self.model.num_moe_layers:
            blocks["moe_layer"] = low.layer(moe=True)

        def total(tasks):  # the per-pass host task is the runtime profile's business here
            return sum(float(t.time_s) * t.count for t in tasks if t.kind != "host")

        def kernels(tasks):
            return sum(t.count for t in tasks if t.kind != "host" and float(t.time_s) > 0)

        times, launches = [], 0
        for p in range(s.pp):
            t = self.dense_layers[p] * total(blocks.get("dense_layer", [])) + \
                self.moe_layers[p] * total(blocks.get("moe_layer", []))
            launches += self.dense_layers[p] * kernels(blocks.get("dense_layer", [])) + \
                self.moe_layers[p] * kernels(blocks.get("moe_layer", []))
            edge = (blocks["first"] if p == 0 else []) + (blocks["last"] if p == s.pp - 1 else blocks["p2p"])
            times.append(t + total(edge))
            launches += kernels(edge)
        self._memo[key] = (times, launches)
        return times, launches

    # ------------------------------------------------------------------ attention
    def attention_s(self, group: GroupBatch) -> float:
        """One layer's attention kernels for one group: a prefill kernel and a decode kernel."""
        m, act = self.model, self.w.activation_bytes
        heads = m.num_heads
        time = 0.0
        if group.chunks:
            d_qk, d_v = attention_dims(m, "prefill")
            pairs = sum(c * (p + c / 2.0) for c, p in group.chunks)  # causal (query, key) pairs
            kv_tokens = sum(p + c for c, p in group.chunks)
            new = sum(c for c, _ in group.chunks)
            flops = 2.0 * pairs * heads * (d_qk + d_v)
            nbytes = kv_tokens * self._kv_layer + new * 2.0 * heads * (d_qk + d_v) * act
            time += float(attention_time_s(flops / self._flop_div / self._seq_split,
                                           nbytes / self._byte_div / self._seq_split, self.gpu, self.w.precision))
        if group.decode_contexts:
            d_qk, d_v = attention_dims(m, "decode")
            ctx_sum = float(sum(group.decode_contexts))
            n = len(group.decode_contexts)
            flops = 2.0 * ctx_sum * heads * (d_qk + d_v)
            nbytes = ctx_sum * self._kv_layer + n * heads * (d_qk + d_v) * act
            time += float(attention_time_s(flops / self._flop_div / self._seq_split,
                                           nbytes / self._byte_div / self._seq_split, self.gpu, self.w.precision))
        return time

    # ------------------------------------------------------------------ a step
    def stage_times(self, groups: list[GroupBatch]) -> tuple[list[float], int, int]:
        """Per-stage GPU seconds of the step, the kernels it launches, and its busiest group's tokens."""
        busy = [g for g in groups if g.tokens > 0]
        if not busy:
            return [0.0] * self.strategy.pp, 0, 0
        tokens = max(g.tokens for g in busy)
        sampled = max(g.sampled for g in busy)
        base, launches = self._lowered(tokens, sampled)
        attn = max(self.attention_s(g) for g in busy)
        layers = [d + e for d, e in zip(self.dense_layers, self.moe_layers, strict=True)]
        return [b + n * attn for b, n in zip(base, layers, strict=True)], launches, tokens
