"""The paged KV cache of one attention group: how many tokens fit, and who holds which blocks.

Capacity comes from the memory model (:func:`simcore.memory.memory_per_gpu_bytes`): the share of HBM
the runtime may use (``RuntimeProfile.mem_fraction``, capped by the GPU's usable HBM), less the
weights and the activations of the largest step (a step of ``max_num_batched_tokens`` tokens, probed
through the same memory model), divided by the KV bytes one token costs on the fullest GPU of the group.
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

__all__ = ["kv_capacity_tokens", "kv_bytes_per_token", "KvCache"]


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


def kv_capacity_tokens(ctx: CostContext, strategy: Strategy, runtime: RuntimeProfile) -> int:
    """Tokens of KV cache one attention group holds (0 when the weights alone do not fit)."""
    gpu = ctx.cluster.gpu
    budget = min(gpu.hbm_bytes * runtime.mem_fraction, gpu.usable_hbm_bytes)
    probe = replace(ctx, workload=replace(ctx.workload, phase="prefill", input_len=runtime.max_num_batched_tokens,
                                          output_len=1))
    one = strategy.replace(dp=1, batch=strategy.ep, microbatches=1)
    used = float(memory_per_gpu_bytes(probe, StrategyArrays.from_strategies([one]))[0])
    # the probe holds the KV of one step's tokens too: give it back
    used -= runtime.max_num_batched_tokens * kv_bytes_per_token(ctx, strategy)
    free = budget - used
    return max(int(free // kv_bytes_per_token(ctx, strategy)), 0)


class KvCache:
    """Block accounting of one attention group: ``capacity_tokens`` in blocks of ``block_tokens``."""

    def __init__(self, capacity_tokens: int, block_tokens: int):
        self.block_tokens = block_tokens
        self.total_blocks = capacity_tokens // block_tokens
        self.free_blocks = self.total_blocks
        self.held: dict[int, int] = {}  # request id -> blocks

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_tokens)

    def need(self, req: Request, tokens: int) -> int:
        """Further blocks ``req`` needs to hold ``tokens`` tokens of KV."""
        return max(self.blocks_for(tokens) - self.held.get(req.rid, 0), 0)

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
