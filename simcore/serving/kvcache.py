"""The paged KV cache of one attention group: how many tokens fit, and who holds which blocks.

Capacity comes from the memory model (:func:`simcore.cost.memory.memory_per_gpu_bytes`): the share of HBM
the runtime may use (``RuntimeProfile.mem_fraction``, capped by the GPU's usable HBM), less the
weights, the activations of the largest step (a step of ``max_num_batched_tokens`` tokens, probed
through the same memory model) and what else the runtime holds (``RuntimeProfile.reserved_bytes``), divided
by the KV bytes one token costs on the fullest GPU of the group.
A runtime whose fraction is of the memory left after weights and activations
(``RuntimeProfile.mem_fraction_of_free``: TensorRT-LLM) gets that share of the usable HBM they leave.
SGLang's fraction is static (``RuntimeProfile.mem_fraction_static``): weights and KV cache only, the
activations and CUDA graphs live in the memory it leaves out; without a launch value it is SGLang's
own default for the GPU and layout (:func:`sglang_mem_fraction`).

A hybrid model's linear-attention layers (Gated DeltaNet) keep a fixed state per sequence instead of
KV per token (:func:`state_bytes_per_sequence`). It comes out of the same pool, as vLLM's hybrid
allocator pages one state per request beside the attention blocks: every sequence the cache holds
takes ``state_blocks`` blocks on top of the blocks of its tokens, from admission to release.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import memory_breakdown, memory_per_gpu_bytes, stage_layers
from simcore.serving.requests import Request
from simcore.serving.runtime import RuntimeProfile
from simcore.strategy.opgraph import DIM0, DIM1
from simcore.strategy.sharding import Strategy

__all__ = ["kv_capacity_tokens", "pool_memory", "kv_bytes_per_token", "state_bytes_per_sequence", "state_blocks", "KvCache",
           "sglang_mem_fraction"]


def kv_bytes_per_token(ctx: CostContext, strategy: Strategy) -> float:
    """KV-cache bytes one token of one sequence costs on the fullest GPU of its attention group."""
    m = ctx.model
    dense, moe, _ = stage_layers(m, np.array([strategy.pp]))
    layers = float((dense[0] + moe[0]).max())
    per_layer = m.kv_cache_bytes_per_token(ctx.workload.kv_bytes) / m.num_layers
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


def sglang_mem_fraction(gpu, strategy: Strategy, runtime: RuntimeProfile) -> float:
    """SGLang's default ``--mem-fraction-static`` (``ServerArgs._handle_gpu_memory_settings``, SGLang 0.5;
    sgl-project/sglang#10975): of the GPU's memory in MiB it reserves, for the memory outside the static
    pool, 512 + 1.5 x the chunked-prefill size + 2 x the CUDA-graph batch limit + 1024 x tp x pp / 8,
    with DP attention 3 x (and above 300, 4.5 x) the graph limit per DP rank more, at least 10 GiB on a GPU
    over 60 GiB; the fraction is the rest, to three places. The graph limit is SGLang's default for the
    GPU (256 below TP 4 on an 80-160 GiB GPU, else 512); ``--tp`` is the worker's whole width (tp x attention
    DP), the chunk the runtime's token budget."""
    mib = gpu.hbm_bytes / 2**20
    width = strategy.tp * strategy.ep
    graph_bs = 256 if width < 4 and mib < 160 * 1024 else 512
    reserved = 512 + max(runtime.max_num_batched_tokens, 2048) * 1.5 + graph_bs * 2 + width * strategy.pp / 8 * 1024
    if strategy.ep > 1:  # DP attention
        reserved += graph_bs * strategy.ep * (4.5 if graph_bs > 300 else 3.0)
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


def kv_capacity_tokens(ctx: CostContext, strategy: Strategy, runtime: RuntimeProfile) -> int:
    """Tokens of KV cache one attention group holds (0 when the weights alone do not fit)."""
    gpu = ctx.cluster.gpu
    fraction = runtime.mem_fraction if runtime.mem_fraction is not None else sglang_mem_fraction(gpu, strategy,
                                                                                                   runtime)
    budget = min(gpu.hbm_bytes * fraction, gpu.usable_hbm_bytes)
    # the probe's step: the largest one, whose activations count against the fraction, except in a static
    # pool (SGLang), which holds weights and KV only: then one token, activations ~ 0
    step = 1 if runtime.mem_fraction_static else runtime.max_num_batched_tokens
    probe = replace(ctx, workload=replace(ctx.workload, phase="prefill", input_len=step, output_len=1))
    one = strategy.replace(dp=1, batch=strategy.ep, microbatches=1)
    used = float(memory_per_gpu_bytes(probe, StrategyArrays.from_strategies([one]))[0])
    # the probe holds the KV of one step's tokens, and one sequence's state, too: give them back
    state = state_bytes_per_sequence(ctx, strategy)
    if strategy.choice("attention") == DIM0:
        state *= strategy.tp  # the probe's one sequence sits whole on one GPU
    used -= step * kv_bytes_per_token(ctx, strategy) + state
    used += runtime.reserved_bytes  # what the runtime's memory profile holds beside these (RuntimeProfile)
    free = fraction * (gpu.usable_hbm_bytes - used) if runtime.mem_fraction_of_free else budget - used
    return max(int(free // kv_bytes_per_token(ctx, strategy)), 0)


def pool_memory(ctx: CostContext, strategy: Strategy, runtime: RuntimeProfile) -> dict[str, float]:
    """A serving pool's HBM on its fullest GPU, by part, in bytes: weights, the KV cache the runtime
    allocates (:func:`kv_capacity_tokens`), the activations of its largest step, what the runtime's
    memory profile holds beside them (``RuntimeProfile.reserved_bytes``) and the GPU's workspace (CUDA
    context, NCCL); ``headroom_bytes``: what the memory fraction leaves unallocated."""
    step = 1 if runtime.mem_fraction_static else runtime.max_num_batched_tokens
    probe = replace(ctx, workload=replace(ctx.workload, phase="prefill", input_len=step, output_len=1))
    parts = memory_breakdown(probe, strategy.replace(dp=1, batch=strategy.ep, microbatches=1))
    kv = kv_capacity_tokens(ctx, strategy, runtime) * kv_bytes_per_token(ctx, strategy)
    out = {"weights_bytes": parts.weights_bytes, "kv_cache_bytes": kv, "activations_bytes": parts.activations_bytes,
           "runtime_reserved_bytes": float(runtime.reserved_bytes), "workspace_bytes": parts.workspace_bytes}
    total = sum(out.values())
    return out | {"total_bytes": total, "capacity_bytes": parts.capacity_bytes,
                  "headroom_bytes": parts.capacity_bytes - total}


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
