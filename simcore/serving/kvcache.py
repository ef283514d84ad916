"""The paged KV cache of one attention group: how many tokens fit, and who holds which blocks.

Capacity comes from the memory model (:func:`simcore.memory.memory_per_gpu_bytes`): the share of HBM
the runtime may use (``RuntimeProfile.mem_fraction``, capped by the GPU's usable HBM), less the
weights and the activations of the largest step (a step of ``max_num_batched_tokens`` tokens, probed
through the same memory model), divided by the KV bytes one token costs on the fullest GPU of the group.
A runtime whose fraction is of the memory left after weights and activations
(``RuntimeProfile.mem_fraction_of_free``: TensorRT-LLM) gets that share of the usable HBM they leave.

A hybrid model's linear-attention layers (Gated DeltaNet) keep a fixed state per sequence instead of
KV per token (:func:`state_bytes_per_sequence`). It comes out of the same pool, as vLLM's hybrid
allocator pages one state per request beside the attention blocks: every sequence the cache holds
takes ``state_blocks`` blocks on top of the blocks of its tokens, from admission to release.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..lowering import CostContext, StrategyArrays
from ..memory import memory_per_gpu_bytes, stage_layers
from ..opgraph import DIM0, DIM1
from ..strategy import Strategy
from .requests import Request
from .runtime import RuntimeProfile

__all__ = ["kv_capacity_tokens", "kv_bytes_per_token", "state_bytes_per_sequence", "state_blocks", "KvCache"]


def kv_bytes_per_token(ctx: CostContext, strategy: Strategy) -> float:
    """KV-cache bytes one token of one sequence costs on the fullest GPU of its attention group."""
    m = ctx.model
    dense, moe, _ = stage_layers(m, np.array([strategy.pp]))
    layers = float((dense[0] + moe[0]).max())
    per_layer = m.kv_cache_elements_per_token() / m.num_layers * ctx.workload.kv_bytes
    choice = strategy.choice("attention")
    div = 1.0
    if choice == DIM1:
        div = 1.0 if m.is_mla else float(min(strategy.tp, m.num_kv_heads))
    elif choice == DIM0:
        div = float(strategy.tp)  # sequences split over the group's GPUs
    return per_layer * layers / div


def state_bytes_per_sequence(ctx: CostContext, strategy: Strategy) -> float:
    """Linear-attention state (conv + recurrent) bytes one sequence holds on the fullest GPU of its
    attention group, whatever its length: the mean layer's share times the stage's layers, split as
    :func:`kv_bytes_per_token` splits KV (heads under ``dim1``, sequences under ``dim0``); 0 without
    linear attention."""
    m = ctx.model
    if not m.is_hybrid:
        return 0.0
    dense, moe, _ = stage_layers(m, np.array([strategy.pp]))
    layers = float((dense[0] + moe[0]).max())
    per_layer = m.linear_state_bytes_per_sequence(ctx.workload.activation_bytes) / m.num_layers
    div = float(strategy.tp) if strategy.choice("attention") in (DIM0, DIM1) else 1.0
    return per_layer * layers / div


def state_blocks(ctx: CostContext, strategy: Strategy, block_tokens: int) -> int:
    """KV blocks of ``block_tokens`` tokens that one sequence's linear-attention state fills (0 without)."""
    state = state_bytes_per_sequence(ctx, strategy)
    return math.ceil(state / (kv_bytes_per_token(ctx, strategy) * block_tokens)) if state else 0


def kv_capacity_tokens(ctx: CostContext, strategy: Strategy, runtime: RuntimeProfile) -> int:
    """Tokens of KV cache one attention group holds (0 when the weights alone do not fit)."""
    gpu = ctx.cluster.gpu
    budget = min(gpu.hbm_bytes * runtime.mem_fraction, gpu.usable_hbm_bytes)
    probe = replace(ctx, workload=replace(ctx.workload, phase="prefill", input_len=runtime.max_num_batched_tokens,
                                          output_len=1))
    one = strategy.replace(dp=1, batch=strategy.ep, microbatches=1)
    used = float(memory_per_gpu_bytes(probe, StrategyArrays.from_strategies([one]))[0])
    # the probe holds the KV of one step's tokens, and one sequence's state, too: give them back
    state = state_bytes_per_sequence(ctx, strategy)
    if strategy.choice("attention") == DIM0:
        state *= strategy.tp  # the probe's one sequence sits whole on one GPU
    used -= runtime.max_num_batched_tokens * kv_bytes_per_token(ctx, strategy) + state
    if runtime.mem_fraction_of_free:
        free = runtime.mem_fraction * (gpu.usable_hbm_bytes - used)
    else:
        free = budget - used
    return max(int(free // kv_bytes_per_token(ctx, strategy)), 0)


class KvCache:
    """Block accounting of one attention group: ``capacity_tokens`` in blocks of ``block_tokens``; each
    sequence held also takes ``state_blocks`` blocks of linear-attention state (:func:`state_blocks`)."""

    def __init__(self, capacity_tokens: int, block_tokens: int, state_blocks: int = 0):
        self.block_tokens = block_tokens
        self.state_blocks = state_blocks
        self.total_blocks = capacity_tokens // block_tokens
        self.free_blocks = self.total_blocks
        self.held: dict[int, int] = {}  # request id -> blocks (its tokens' and its state's)

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_tokens)

    def blocks_alone(self, tokens: int) -> int:
        """Blocks one sequence of ``tokens`` tokens holds: its KV and its state."""
        return self.blocks_for(tokens) + self.state_blocks

    def need(self, req: Request, tokens: int) -> int:
        """Further blocks ``req`` needs to hold ``tokens`` tokens of KV (and its state, if not held yet)."""
        return max(self.blocks_alone(tokens) - self.held.get(req.rid, 0), 0)

    def grow(self, req: Request, tokens: int) -> bool:
        """Hold ``tokens`` tokens for ``req`` if the blocks are free; False (nothing changed) if not."""
        n = self.need(req, tokens)
        if n > self.free_blocks:
            return False
        self.free_blocks -= n
        self.held[req.rid] = self.held.get(req.rid, 0) + n
        return True

    def release(self, req: Request) -> None:
        self.free_blocks += self.held.pop(req.rid, 0)

    @property
    def used_fraction(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 1.0
