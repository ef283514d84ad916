"""The time a worker takes to re-shard its weights (and resident KV cache) from one layout to another.

Seesaw (Su et al., arXiv 2503.06433, :mod:`.seesaw`) switches every worker between a prefill and a decode
sharding of the same GPUs; each switch moves the bytes a GPU lacks under the new layout between GPUs.

Going from layout A to layout B, GPU ``g`` receives
``R_g = sum_x b_x * (h_B(g,x) * f_B(x) - h_A(g,x) * h_B(g,x) * o(x))`` bytes, where ``x`` runs over the weight tensors (each layer's ``qkv``, ``out_proj``, MLP or router / shared / expert matrices,
the embedding on the first stage, the LM head on the last) and each layer's KV of the resident tokens;
``b_x`` is its bytes in all (the memory model's, :func:`simcore.cost.memory.memory_per_gpu_bytes`);
``h_S(g,x) = 1`` when GPU ``g``'s stage under ``S`` (``g // (tp * ep)``, layers split as
:func:`simcore.cost.memory.stage_layers`) holds ``x``; ``f_S(x)`` the share one GPU holds (``1 / tp`` along a
sharded dimension, 1 replicated; routed experts also ``ceil((E + R) / ep) / E``; KV ``1 / min(tp,
kv_heads)`` under head sharding, as :func:`~simcore.serving.kvcache.kv_bytes_per_token`); ``o(x)`` the
share already in place: ``min(f_A, f_B)`` when both split the same dimension or either replicates
(Megatron's contiguous slices nest when one degree divides the other, the GPUs of a stage numbered so
that each new slice lies in its old one: exact for power-of-two degrees, a lower bound otherwise), ``f_A * f_B`` when they split different dimensions (a row
block meets a column block); experts times ``min`` of the expert shares. The re-shard takes
``max_g R_g / B``: ``B`` the NVLink rate per direction times the NCCL ring-channel efficiency the
collectives are fitted with (``nvlink_efficiency``, as :meth:`StepCost.custom_all_reduce_s`) when the
worker sits in one NVLink domain, else the NIC rate times ``nic_efficiency``. Identical layouts: 0. Tied
embeddings under ``pp > 1`` count the head as its own copy. Only the receiving side is priced: every
GPU receives at once over its own links, and the senders of each shard can be spread over its holders.
"""

from __future__ import annotations

import math

import numpy as np

from simcore.collectives.constants import DEFAULT
from simcore.cost.lowering import CostContext
from simcore.strategy.opgraph import DIM0, DIM1, REPLICATED, model_ops
from simcore.strategy.sharding import Strategy

__all__ = ["reshard_bytes_per_gpu", "reshard_s", "fabric_bytes_per_s"]

_LAYER_OPS = {"dense": ("qkv", "out_proj", "dense_ffn1", "dense_ffn2"),
              "moe": ("qkv", "out_proj", "router", "shared_ffn1", "shared_ffn2", "expert_ffn1", "expert_ffn2")}


def _share(ctx: CostContext, s: Strategy, op: str) -> tuple[int, float, float]:
    """``(choice, share along the sharded dimension, share of the experts)`` one GPU holds of ``op``."""
    m = ctx.model
    if op == "kv":  # a layer's KV cache, split as kvcache.kv_bytes_per_token splits it
        c = s.choice("attention")
        div = {DIM1: 1.0 if m.is_mla else float(min(s.tp, m.num_kv_heads)), DIM0: float(s.tp)}.get(c, 1.0)
        return (REPLICATED if div == 1.0 else c), 1.0 / div, 1.0
    c = s.choice(op)
    experts = math.ceil((m.num_experts + s.redundant_experts) / s.ep) / m.num_experts if op.startswith("expert") else 1.0
    return c, (1.0 if c == REPLICATED else 1.0 / s.tp), experts


def _held_and_kept(ctx: CostContext, src: Strategy, dst: Strategy, op: str, total_bytes: float) -> tuple[float, float]:
    """Bytes of ``op`` one GPU holds under ``dst``, and those of them it already holds under ``src``."""
    ca, fa, xa = _share(ctx, src, op)
    cb, fb, xb = _share(ctx, dst, op)
    overlap = min(fa, fb) if ca == cb or REPLICATED in (ca, cb) else fa * fb
    return total_bytes * fb * xb, total_bytes * overlap * min(xa, xb)


def _stage_starts(layers: int, pp: int) -> list[int]:
    base, extra = divmod(layers, pp)
    return [p * base + min(p, extra) for p in range(pp + 1)]


def reshard_bytes_per_gpu(ctx: CostContext, src: Strategy, dst: Strategy, resident_tokens: float = 0.0) -> np.ndarray:
    """Bytes each GPU of a worker receives to go from layout ``src`` to ``dst`` (module docstring),
    ``resident_tokens`` tokens of KV cache included; GPUs numbered ``tp`` fastest, then ``ep``, ``pp``."""
    gpus = dst.tp * dst.ep * dst.pp
    if src.tp * src.ep * src.pp != gpus:
        raise ValueError(f"re-shard: tp*ep*pp differ ({src.tp * src.ep * src.pp} vs {gpus})")
    m, w = ctx.model, ctx.workload
    ops = model_ops(m)
    need, keep = {"dense": 0.0, "moe": 0.0}, {"dense": 0.0, "moe": 0.0}
    for kind, names in _LAYER_OPS.items():
        for op in (n for n in names if n in ops):
            per_byte = w.expert_bytes if op.startswith("expert") else w.weight_bytes
            n, k = _held_and_kept(ctx, src, dst, op, ops[op].weight_params * per_byte)
            need[kind] += n
            keep[kind] += k
        if resident_tokens:
            kv_layer = m.kv_cache_bytes_per_token(w.kv_bytes) / m.num_layers * resident_tokens
            n, k = _held_and_kept(ctx, src, dst, "kv", kv_layer)
            need[kind] += n
            keep[kind] += k
    emb = _held_and_kept(ctx, src, dst, "embedding", ops["embedding"].weight_params * w.weight_bytes)
    head = _held_and_kept(ctx, src, dst, "lm_head", ops["lm_head"].weight_params * w.weight_bytes)
    src_head = not (m.tied_embeddings and src.pp == 1)  # a tied head on one stage is the embedding itself
    dst_head = not (m.tied_embeddings and dst.pp == 1)
    dense_before = m.dense_layers_before()
    a, b = _stage_starts(m.num_layers, src.pp), _stage_starts(m.num_layers, dst.pp)

    def layers(lo: int, hi: int) -> tuple[int, int]:
        if hi <= lo:
            return 0, 0
        dense = int(dense_before[hi] - dense_before[lo])
        return dense, hi - lo - dense

    out = np.zeros(gpus)
    for g in range(gpus):
        pa, pb = g // (src.tp * src.ep), g // (dst.tp * dst.ep)
        nd, nm = layers(b[pb], b[pb + 1])
        kd, km = layers(max(a[pa], b[pb]), min(a[pa + 1], b[pb + 1]))
        r = nd * need["dense"] + nm * need["moe"] - kd * keep["dense"] - km * keep["moe"]
        if pb == 0:
            r += emb[0] - (emb[1] if pa == 0 else 0.0)
        if pb == dst.pp - 1 and dst_head:
            r += head[0] - (head[1] if pa == src.pp - 1 and src_head else 0.0)
        out[g] = max(r, 0.0)
    return out


def fabric_bytes_per_s(ctx: CostContext, gpus: int) -> float:
    """The rate one GPU receives re-shard traffic at: NVLink inside one domain, else its NIC."""
    gpu = ctx.cluster.gpu
    if gpus <= ctx.cluster.nvlink_domain_size:
        return gpu.nvlink_bandwidth_bytes_per_s * DEFAULT.nvlink_efficiency
    return gpu.nic_bandwidth_bytes_per_s * DEFAULT.nic_efficiency


def reshard_s(ctx: CostContext, src: Strategy, dst: Strategy, resident_tokens: float = 0.0) -> float:
    """Seconds a worker spends going from layout ``src`` to ``dst``: the busiest GPU's received bytes
    over its fabric rate (module docstring); 0 between identical layouts."""
    received = reshard_bytes_per_gpu(ctx, src, dst, resident_tokens)
    return float(received.max()) / fabric_bytes_per_s(ctx, len(received))
