"""Per-GPU memory (weights, KV cache, linear-attention state, activations) and strategy validity with
machine-readable reasons.

A hybrid model's linear-attention layers (Gated DeltaNet) hold a fixed state per sequence, not a KV
cache: the KV term counts only its softmax-attention layers (per token) and a state term its
linear-attention layers (per sequence), both as the mean over the stage's layers.

Validity is a bitmask per strategy so 10^5 strategies are checked at once; :func:`reason_names`
turns one mask into names such as ``"hbm_capacity"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.models import sparse_attention as dsa
from simcore.strategy.opgraph import DIM0, DIM1, REPLICATED, model_ops

__all__ = ["REASONS", "reason_names", "stage_layers", "memory_per_gpu_bytes", "MemoryBreakdown",
           "memory_breakdown", "structural_reasons", "explain_reasons", "redundant_fit_error"]

REASONS = (
    "device_count",      # tp * ep * pp * dp differs from the cluster's GPU count
    "heads_divisibility",  # heads (or KV heads) not divisible by tp under head sharding
    "feature_divisibility",  # a sharded weight dimension not divisible by tp
    "experts_divisibility",  # more EP ranks than routed experts (or ep > 1 on a dense model)
    "layers",            # more pipeline stages than layers
    "batch_divisibility",  # batch not divisible by ep * microbatches
    "hbm_capacity",      # weights + KV cache + activations exceed usable HBM
    "ttft_slo",          # time to first token above the SLO
    "tpot_slo",          # time per output token above the SLO
    "domain_straddle",   # a TP or EP group straddles NVLink domains unevenly (e.g. 32 ranks in 72-GPU racks)
    "redundant_experts",  # more expert replicas than ranks to hold them apart (any at ep = 1, or a dense model)
)
_BIT = {name: 1 << i for i, name in enumerate(REASONS)}


def reason_names(mask: int) -> list[str]:
    """Names of the reasons set in one strategy's mask."""
    return [name for name, bit in _BIT.items() if int(mask) & bit]


def bit(name: str) -> int:
    return _BIT[name]


def stage_layers(model, pp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense and MoE layer counts of each stage, shape ``[n, max(pp)]``, plus the stage mask.

    Layers are split contiguously; the first ``L mod pp`` stages get one extra layer. Each stage's
    dense layers are counted from the model's own pattern (DeepSeek's dense-first layers, Llama-4's
    interleaving, Qwen-MoE's ``mlp_only_layers``).
    """
    pp = np.asarray(pp)
    n_layers = model.num_layers
    stages = np.arange(int(pp.max()))[None, :]
    p = pp[:, None]
    base, extra = n_layers // p, n_layers % p
    count = base + (stages < extra)
    start = stages * base + np.minimum(stages, extra)
    in_stage = stages < p
    before = model.dense_layers_before()
    end = np.where(in_stage, start + count, 0)
    dense = before[np.clip(end, 0, n_layers)] - before[np.clip(np.where(in_stage, start, 0), 0, n_layers)]
    return np.where(in_stage, dense, 0), np.where(in_stage, count - dense, 0), in_stage


def _experts_per_gpu(model, ep, redundant=0):
    """Expert slots per GPU: ``ceil((E + redundant) / ep)`` (:func:`simcore.moe.slots_per_rank`;
    spare slots when ``ep`` does not divide ``E`` hold redundant experts at no extra memory)."""
    return np.ceil((model.num_experts + redundant) / np.maximum(ep, 1)) if model.is_moe else 0.0


def _shard(choice: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.where(choice == REPLICATED, 1.0, t)


def _layer_terms(ctx: CostContext, s: StrategyArrays) -> dict[str, np.ndarray]:
    """Bytes per GPU of one layer's parts (``attn``, ``dense``, ``moe`` weights; ``kv``: KV cache and
    linear-attention state), of the ``embedding`` and ``lm_head``, and of the step's ``activations``."""
    m, w = ctx.model, ctx.workload
    ops = model_ops(m)
    t = s.tp.astype(float)
    wb = w.weight_bytes

    def weights(name: str) -> np.ndarray:
        return ops[name].weight_params * wb / _shard(s.choice[name], t) if name in ops else np.zeros(len(s))

    attn = weights("qkv") + weights("out_proj") + dsa.indexer_params(m) * wb  # the indexer: on every rank
    dense = weights("dense_ffn1") + weights("dense_ffn2")
    moe = (weights("router") + weights("shared_ffn1") + weights("shared_ffn2")
           + (weights("expert_ffn1") + weights("expert_ffn2")) * (w.expert_bytes / wb) / max(m.num_experts, 1)
           * _experts_per_gpu(m, s.ep, s.redundant))
    seqs_group = s.batch / s.ep
    # a windowed layer holds at most its window (attention_context is the mean over layers)
    kv_layer = m.kv_cache_bytes_per_token(w.kv_bytes) / m.num_layers * m.attention_context(w.max_context)
    c_attn = s.choice["attention"]
    kv_heads_shard = 1.0 if m.is_mla else np.minimum(t, m.num_kv_heads)
    seqs_local = np.where(c_attn == DIM0, np.ceil(seqs_group / t), seqs_group)
    kv = kv_layer * seqs_local / np.where(c_attn == DIM1, kv_heads_shard, 1.0)
    # linear-attention state: its heads and conv channels split under dim1 like the attention heads
    state_layer = m.linear_state_bytes_per_sequence(w.activation_bytes) / m.num_layers
    kv = kv + state_layer * seqs_local / np.where(c_attn == DIM1, t, 1.0)

    tokens = s.batch / (s.ep * s.microbatches) * (w.input_len if w.phase != "decode" else 1)
    widest = max(op.out_features for name, op in ops.items() if name not in ("embedding", "lm_head"))
    widest = max(widest, m.top_k * (2 if m.gated_mlp else 1) * max(m.expert_ffn_size, 1))
    logits = s.batch / s.ep * m.vocab_size * 4.0  # fp32 logits of the last position
    activations = tokens * w.activation_bytes * (4.0 * m.hidden_size + widest) + logits
    return {"attn": attn, "dense": dense, "moe": moe, "kv": kv, "embedding": weights("embedding"),
            "lm_head": weights("lm_head"), "activations": activations}


def _stage_bytes(ctx: CostContext, s: StrategyArrays, terms: dict) -> tuple[np.ndarray, np.ndarray]:
    """Weights + KV bytes of each stage's GPU and the KV bytes alone, shape ``[n, max(pp)]``."""
    m = ctx.model
    attn, dense, moe, kv = terms["attn"], terms["dense"], terms["moe"], terms["kv"]
    n_dense, n_moe, in_stage = stage_layers(m, s.pp)
    per_stage = n_dense * (attn + dense + kv)[:, None] + n_moe * (attn + moe + kv)[:, None]
    stages = np.arange(per_stage.shape[1])[None, :]
    tied_single = m.tied_embeddings & (s.pp == 1)
    head = np.where(tied_single, 0.0, terms["lm_head"])
    per_stage = per_stage + np.where(stages == 0, terms["embedding"][:, None], 0.0)
    per_stage = per_stage + np.where(stages == (s.pp - 1)[:, None], head[:, None], 0.0)
    return np.where(in_stage, per_stage, 0.0), np.where(in_stage, (n_dense + n_moe) * kv[:, None], 0.0)


def memory_per_gpu_bytes(ctx: CostContext, s: StrategyArrays) -> np.ndarray:
    """Peak HBM bytes of the fullest GPU (max over pipeline stages), per strategy."""
    terms = _layer_terms(ctx, s)
    return _stage_bytes(ctx, s, terms)[0].max(axis=1) + terms["activations"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """One strategy's HBM on its fullest GPU (the pipeline stage holding the most), by part, in bytes.

    ``workspace_bytes`` is what the model leaves aside on every GPU (CUDA context, NCCL buffers,
    allocator slack: :attr:`GpuSpec.hbm_reserved_bytes`); the plan fits when ``total_bytes`` (the
    four parts) is at most ``capacity_bytes``, the GPU's HBM, the test behind ``hbm_capacity``."""

    gpu: str
    weights_bytes: float
    kv_cache_bytes: float  # KV cache and linear-attention state
    activations_bytes: float
    workspace_bytes: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.activations_bytes + self.workspace_bytes

    @property
    def headroom_bytes(self) -> float:
        """Capacity left (negative: over capacity)."""
        return self.capacity_bytes - self.total_bytes

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes,
                "activations_bytes": self.activations_bytes, "workspace_bytes": self.workspace_bytes,
                "total_bytes": self.total_bytes, "capacity_bytes": self.capacity_bytes,
                "headroom_bytes": self.headroom_bytes, "fits": self.headroom_bytes >= 0}

    def line(self) -> str:
        """``96.1 GB per GPU (weights 70.6, KV 21.5, activations 0.0, workspace 4.0) > 85.5 GB on h100-sxm``."""
        op = ">" if self.headroom_bytes < 0 else "<="
        return (f"{self.total_bytes / 1e9:.1f} GB per GPU (weights {self.weights_bytes / 1e9:.1f}, KV "
                f"{self.kv_cache_bytes / 1e9:.1f}, activations {self.activations_bytes / 1e9:.1f}, workspace "
                f"{self.workspace_bytes / 1e9:.1f}) {op} {self.capacity_bytes / 1e9:.1f} GB on {self.gpu}")


def memory_breakdown(ctx: CostContext, strategy) -> MemoryBreakdown:
    """:class:`MemoryBreakdown` of one strategy: the parts of :func:`memory_per_gpu_bytes` on the
    GPU it counts, plus the reserved workspace."""
    s = StrategyArrays.from_strategies([strategy])
    terms = _layer_terms(ctx, s)
    held, kv = _stage_bytes(ctx, s, terms)
    fullest = int(np.argmax(held[0]))
    gpu = ctx.cluster.gpu
    return MemoryBreakdown(gpu.name, float(held[0, fullest] - kv[0, fullest]), float(kv[0, fullest]),
                           float(terms["activations"][0]), float(gpu.hbm_reserved_bytes), float(gpu.hbm_bytes))


def structural_reasons(ctx: CostContext, s: StrategyArrays) -> np.ndarray:
    """Bitmask of everything that makes a strategy unrunnable regardless of its cost."""
    m = ctx.model
    ops = model_ops(m)
    t = s.tp
    mask = np.zeros(len(s), dtype=np.int64)
    mask |= np.where(s.tp * s.ep * s.pp * s.dp != ctx.cluster.num_gpus, bit("device_count"), 0)
    heads_split = (s.choice["qkv"] == DIM1) | (s.choice["attention"] == DIM1)
    kv_ok = np.where(t <= m.num_kv_heads, m.num_kv_heads % t == 0, t % m.num_kv_heads == 0)
    heads_bad = heads_split & ((m.num_heads % t != 0) | ~kv_ok)
    if m.is_hybrid:  # vLLM divides the Gated DeltaNet key and value heads over the TP ranks
        heads_bad |= heads_split & ((m.linear_key_heads % t != 0) | (m.linear_value_heads % t != 0))
    mask |= np.where(heads_bad, bit("heads_divisibility"), 0)
    # attention and qkv split by heads (checked above); vocabularies are padded to the group
    names = [n for n in ops if n not in ("attention", "qkv", "embedding", "lm_head")]
    if names:
        in_f = np.array([ops[n].in_features for n in names])
        out_f = np.array([ops[n].out_features for n in names])
        choice = np.stack([s.choice[n] for n in names], axis=1)
        t2 = t[:, None]
        bad = ((choice == DIM0) & (in_f % t2 != 0)) | ((choice == DIM1) & (out_f % t2 != 0))
        feat_bad = bad.any(axis=1)
    else:
        feat_bad = np.zeros(len(s), dtype=bool)
    mask |= np.where(feat_bad, bit("feature_divisibility"), 0)
    # ep need not divide the experts: the spare slots of ceil(E / ep) hold redundant copies of hot
    # experts, as DeepSeek's EPLB deployments do (EP72 over 256 experts)
    experts_bad = (s.ep > 1) if not m.is_moe else (s.ep > m.num_experts)
    mask |= np.where(experts_bad, bit("experts_divisibility"), 0)
    mask |= np.where(s.pp > m.num_layers, bit("layers"), 0)
    mask |= np.where(s.batch % (s.ep * s.microbatches) != 0, bit("batch_divisibility"), 0)
    # Ranks are packed TP-innermost, so TP groups tile blocks of tp GPUs and EP groups blocks of
    # tp * ep. A block that neither fits a whole number of times in an NVLink domain nor covers whole
    # domains puts different rank counts in different domains: the collective cost model (one count
    # per domain) cannot price that, and no deployment would choose it over using fewer GPUs per domain.
    domain = ctx.cluster.nvlink_domain_size
    straddle = np.zeros(len(s), dtype=bool)
    for block in (s.tp, s.tp * s.ep):
        straddle |= (domain % block != 0) & (block % domain != 0)
    mask |= np.where(straddle, bit("domain_straddle"), 0)
    # each replica needs a rank that lacks its expert: at most E x (ep - 1) of them
    mask |= np.where(s.redundant > m.num_experts * (s.ep - 1), bit("redundant_experts"), 0)
    return mask


def _feature_detail(ctx: CostContext, strategy) -> str:
    """The first operator whose sharded dimension ``tp`` does not divide, with the numbers."""
    ops = model_ops(ctx.model)
    s, t = StrategyArrays.from_strategies([strategy]), strategy.tp
    for name, op in ops.items():
        if name in ("attention", "qkv", "embedding", "lm_head"):
            continue
        c = int(s.choice[name][0])
        size = op.in_features if c == DIM0 else op.out_features if c == DIM1 else 0
        if size and size % t:
            return f"{name} splits {size} features over tp={t}"
    return f"a sharded dimension over tp={t}"


def explain_reasons(ctx: CostContext, strategy, reasons: list[str]) -> list[str]:
    """``reason: the numbers behind it`` for each of one strategy's ``reasons`` (names of :data:`REASONS`),
    e.g. ``device_count: tp*ep*pp*dp = 3*1*1*1 = 3 GPUs, the cluster has 8``."""
    m, st, w = ctx.model, strategy, ctx.workload
    gpus = st.tp * st.ep * st.pp * st.dp
    heads = f"{m.num_heads} heads, {m.num_kv_heads} KV heads"
    if m.is_hybrid:
        heads += f", {m.linear_key_heads}/{m.linear_value_heads} linear key/value heads"
    detail = {
        "device_count": lambda: f"tp*ep*pp*dp = {st.tp}*{st.ep}*{st.pp}*{st.dp} = {gpus} GPUs, "
                                f"the cluster has {ctx.cluster.num_gpus}",
        "heads_divisibility": lambda: f"{heads} over tp={st.tp}",
        "feature_divisibility": lambda: _feature_detail(ctx, st),
        "experts_divisibility": lambda: (f"ep={st.ep} over {m.num_experts} routed experts" if m.is_moe
                                         else f"ep={st.ep} on a dense model"),
        "layers": lambda: f"pp={st.pp} stages for {m.num_layers} layers",
        "batch_divisibility": lambda: f"batch={st.batch} over ep*microbatches = {st.ep * st.microbatches}",
        "hbm_capacity": lambda: memory_breakdown(ctx, st).line(),
        "ttft_slo": lambda: f"TTFT above the {w.ttft_slo_s * 1e3:g} ms SLO",
        "tpot_slo": lambda: f"TPOT above the {w.tpot_slo_s * 1e3:g} ms SLO",
        "domain_straddle": lambda: f"tp={st.tp}, tp*ep={st.tp * st.ep} neither tile nor cover NVLink domains of "
                                   f"{ctx.cluster.nvlink_domain_size} GPUs",
        "redundant_experts": lambda: f"{st.redundant_experts} replicas, at most {m.num_experts}*(ep-1) = "
                                     f"{m.num_experts * (st.ep - 1)}",
    }
    return [f"{r}: {detail[r]()}" if r in detail else r for r in reasons]


def redundant_fit_error(ctx: CostContext, strategy) -> str | None:
    """The one-line reason a strategy's ``redundant_experts`` overflow HBM where the same strategy
    without them fits, else None."""
    n = getattr(strategy, "redundant_experts", 0)
    if not n:
        return None
    s = StrategyArrays.from_strategies([strategy, strategy.replace(redundant_experts=0)])
    with_n, without = memory_per_gpu_bytes(ctx, s)
    usable = ctx.cluster.gpu.usable_hbm_bytes
    if with_n <= usable or without > usable:
        return None
    slots = int(_experts_per_gpu(ctx.model, strategy.ep, n))
    return (f"strategy.redundant_experts={n}: {slots} expert slots per GPU need {with_n / 1e9:.1f} GB, "
            f"above the {usable / 1e9:.1f} GB usable HBM of {ctx.cluster.gpu.name} "
            f"(without replicas {without / 1e9:.1f} GB)")
