"""Readers of the MoE families' ``config.json`` (see :mod:`simcore.models.hf_config` for the rules they follow).

Each reader returns :class:`~simcore.models.spec.ModelSpec` fields. Where a config leaves a field out, the
default is the one the family's Hugging Face ``transformers`` model uses. Multi-token-prediction
modules (DeepSeek and GLM ``num_nextn_predict_layers``, MiniMax ``num_mtp_modules``) are not counted, as the
published totals of the main models do not count them.
"""

from __future__ import annotations

from typing import Any

from simcore.models.reader import MISSING as _NONE
from simcore.models.reader import Reader, qwen_attention, windowed_layers

__all__ = ["parse_deepseek", "parse_qwen_moe", "parse_gpt_oss", "parse_llama4", "parse_minimax_m2",
           "parse_glm4_moe", "parse_qwen_hybrid", "QWEN_HYBRID_TYPES"]

#: model_types of the Qwen Gated DeltaNet hybrids, flat (text model) or wrapping a ``text_config``.
QWEN_HYBRID_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")
_STATE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}

def _base(r: Reader) -> dict[str, Any]:
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    return {"num_layers": r.int("num_hidden_layers"), "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": r.int("num_key_value_heads", default=heads),
            "head_dim": r.head_dim(hidden, heads, "num_attention_heads"), "vocab_size": r.int("vocab_size"),
            "tied_embeddings": r.flag("tie_word_embeddings", False)}


def _shared_experts(r: Reader, key: str, expert: int) -> int:
    """Shared experts of ``expert`` width equal to one shared MLP of width ``cfg[key]`` (0 if none)."""
    shared = r.int(key, default=0, minimum=0)
    if shared % expert:
        raise r.error(f"field {key!r}={shared} is not a multiple of the expert size {expert}; "
                      "a shared expert of another width is not expressible")
    return shared // expert


def parse_deepseek(r: Reader) -> dict[str, Any]:
    """DeepSeek-V2/V3/R1, Kimi-K2, and with DeepSeek sparse attention DeepSeek-V3.2 (``deepseek_v32``) and
    GLM-5 (``glm_moe_dsa``): MLA attention, shared + routed experts after dense layers; the indexer's
    ``index_topk`` / ``index_n_heads`` / ``index_head_dim`` (:mod:`simcore.models.sparse_attention`)."""
    heads = r.int("num_attention_heads")
    nope, rope = r.int("qk_nope_head_dim"), r.int("qk_rope_head_dim")
    r.ignore("num_nextn_predict_layers", "indexer_rope_interleave", "rope_interleave", "qk_head_dim")
    if r.has("head_dim") and r.int("head_dim") not in (rope, nope + rope):  # GLM-5 writes the rope part
        raise r.error(f"field 'head_dim'={r.int('head_dim')} is neither qk_rope_head_dim nor qk_nope + qk_rope")
    spec = {"num_layers": r.int("num_hidden_layers"), "hidden_size": r.int("hidden_size"), "num_heads": heads,
            "num_kv_heads": r.int("num_key_value_heads", default=heads), "head_dim": nope + rope,
            "ffn_size": r.int("intermediate_size"), "vocab_size": r.int("vocab_size"),
            "tied_embeddings": r.flag("tie_word_embeddings", False),
            "attention_bias": r.flag("attention_bias", False),
            "q_lora_rank": r.int("q_lora_rank", default=0, minimum=0), "kv_lora_rank": r.int("kv_lora_rank"),
            "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": r.int("v_head_dim")}
    if r.has("n_routed_experts"):
        spec.update(num_experts=r.int("n_routed_experts"), top_k=r.int("num_experts_per_tok"),
                    num_shared_experts=r.int("n_shared_experts", default=0, minimum=0),
                    expert_ffn_size=r.int("moe_intermediate_size"),
                    dense_first_layers=r.int("first_k_dense_replace", default=0, minimum=0),
                    moe_layer_freq=r.int("moe_layer_freq", default=1),
                    router_bias=r.cfg.get("topk_method") == "noaux_tc")
        r.ignore("topk_method")
    if r.has("index_topk"):
        spec.update(index_topk=r.int("index_topk"), index_n_heads=r.int("index_n_heads"),
                    index_head_dim=r.int("index_head_dim"))
    return spec


def parse_qwen_moe(r: Reader) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: layer i is MoE iff not in ``mlp_only_layers`` and ``(i + 1) %
    decoder_sparse_step == 0``; Qwen2-MoE adds one gated shared expert of its own width."""
    spec = _base(r)
    layers = spec["num_layers"]
    spec.update(ffn_size=r.int("intermediate_size"), attention_bias=r.flag("attention_bias", False))
    spec.update(qwen_attention(r, layers))
    spec.update(_qwen_experts(r, layers, shared=r.cfg.get("model_type") == "qwen2_moe"))
    return spec


def _qwen_experts(r: Reader, layers: int, shared: bool) -> dict[str, Any]:
    """The Qwen MoE layout; ``shared``: one sigmoid-gated shared expert of its own width."""
    step = r.int("decoder_sparse_step", default=1)
    dense = set(r.int_list("mlp_only_layers"))
    moe = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if not moe:
        raise r.error(f"fields 'mlp_only_layers' / 'decoder_sparse_step'={step} leave no MoE layer")
    expert = r.int("moe_intermediate_size")
    n_shared = _shared_experts(r, "shared_expert_intermediate_size", expert) if shared else 0
    return {"num_experts": r.same_int("num_experts", "num_local_experts"), "top_k": r.int("num_experts_per_tok"),
            "expert_ffn_size": expert, "num_shared_experts": n_shared, "shared_expert_gate": n_shared > 0,
            "moe_layers": moe}


def parse_qwen_hybrid(r: Reader) -> dict[str, Any]:
    """Qwen3-Next / Qwen3.5 (dense or MoE): Gated DeltaNet layers, gated softmax attention (per-head q/k
    RMSNorm) on the layers ``layer_types`` names ``full_attention``, else every
    ``full_attention_interval``-th; MoE layers as Qwen-MoE's with a gated shared expert. Defaults are
    transformers' ``Qwen3NextConfig`` ones (head_dim 256, interval 4, linear heads 16 / 32 of 128, conv 4)."""
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    layers = r.int("num_hidden_layers")
    spec: dict[str, Any] = {
        "num_layers": layers, "hidden_size": hidden, "num_heads": heads,
        "num_kv_heads": r.int("num_key_value_heads", default=heads), "head_dim": r.int("head_dim", default=256),
        "vocab_size": r.int("vocab_size"), "tied_embeddings": r.flag("tie_word_embeddings", False),
        "attention_bias": r.flag("attention_bias", False), "qk_norm": "head",
        "attn_output_gate": r.flag("attn_output_gate", True)}
    r.ignore("output_gate_type", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "num_nextn_predict_layers")
    linear = _linear_layers(r, layers)
    if linear:
        spec.update(linear_layers=linear, linear_key_heads=r.int("linear_num_key_heads", default=16),
                    linear_value_heads=r.int("linear_num_value_heads", default=32),
                    linear_key_head_dim=r.int("linear_key_head_dim", default=128),
                    linear_value_head_dim=r.int("linear_value_head_dim", default=128),
                    linear_conv_kernel=r.int("linear_conv_kernel_dim", default=4), linear_state_bytes=_state_bytes(r))
        if spec["linear_value_heads"] % spec["linear_key_heads"]:
            raise r.error(f"field 'linear_num_value_heads'={spec['linear_value_heads']} is not a multiple of "
                          f"linear_num_key_heads={spec['linear_key_heads']}")
    else:  # every layer softmax attention: the linear-attention sizes are unused
        r.ignore("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_conv_kernel_dim", "mamba_ssm_dtype")
    if r.int("num_experts", default=0, minimum=0):
        spec.update(_qwen_experts(r, layers, shared=True))
        # Qwen3.5-MoE configs have no intermediate_size: without a dense layer it is unused
        every_layer_moe = len(spec["moe_layers"]) == layers
        spec["ffn_size"] = r.int("intermediate_size", default=spec["expert_ffn_size"] if every_layer_moe else _NONE)
    else:
        r.ignore("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "decoder_sparse_step", "mlp_only_layers")
        spec["ffn_size"] = r.int("intermediate_size")
    return spec


def _linear_layers(r: Reader, layers: int) -> tuple[int, ...]:
    """The Gated DeltaNet layers: from ``layer_types``, else all but every ``full_attention_interval``-th
    (transformers: layer i is full attention iff ``(i + 1) % interval == 0``); both given must agree."""
    interval = r.int("full_attention_interval", default=4)
    derived = tuple(i for i in range(layers) if (i + 1) % interval)
    kinds = r.str_list("layer_types")
    if kinds is None:
        return derived
    if len(kinds) != layers:
        raise r.error(f"field 'layer_types' has {len(kinds)} entries for num_hidden_layers={layers}")
    unknown = sorted(set(kinds) - {"linear_attention", "full_attention"})
    if unknown:
        raise r.error(f"field 'layer_types' has {', '.join(map(repr, unknown))} layers; a Qwen hybrid has only "
                      "'linear_attention' and 'full_attention'")
    linear = tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention")
    if r.cfg.get("full_attention_interval") is not None and linear != derived:
        raise r.error(f"conflicting fields 'layer_types' and 'full_attention_interval'={interval}")
    return linear


def _state_bytes(r: Reader) -> int:
    """Bytes per element of the recurrent state: ``mamba_ssm_dtype`` (Qwen3.5: float32), else the
    16-bit model dtype, which vLLM keeps when the config names none."""
    value = r.cfg.get("mamba_ssm_dtype")
    r.ignore("mamba_ssm_dtype")
    if value is None:
        return 2
    if value not in _STATE_DTYPES:
        raise r.error(f"field 'mamba_ssm_dtype' must be one of {', '.join(_STATE_DTYPES)}, got {value!r}")
    return _STATE_DTYPES[value]


def parse_gpt_oss(r: Reader) -> dict[str, Any]:
    """gpt-oss: alternating sliding-window (``layer_types``) and full attention with per-head sinks and
    biases; every layer MoE with biased experts and router."""
    spec = _base(r)
    layers = spec["num_layers"]
    ffn = r.int("intermediate_size")
    # transformers' default: even layers sliding, odd layers full
    windowed = windowed_layers(r, layers, [(i + 1) % 2 == 1 for i in range(layers)])
    size = r.int("sliding_window", default=128, minimum=1)
    spec.update(ffn_size=ffn, expert_ffn_size=ffn, num_experts=r.same_int("num_local_experts", "num_experts"),
                top_k=r.same_int("num_experts_per_tok", "experts_per_token"),
                attention_bias=r.flag("attention_bias", True), mlp_bias=True, router_bias=True,
                attention_sinks=True)
    if windowed:
        spec.update(sliding_window=size, window_layers=tuple(windowed))
    return spec


def parse_llama4(r: Reader) -> dict[str, Any]:
    """Llama-4 text model: MoE layers every ``interleave_moe_layer_step`` (or ``moe_layers``), each with
    one shared expert; dense layers of ``intermediate_size_mlp``; chunked attention on RoPE layers."""
    spec = _base(r)
    layers = spec["num_layers"]
    step = r.int("interleave_moe_layer_step", default=1)
    derived = tuple(range(step - 1, layers, step))
    moe = r.int_list("moe_layers") or derived
    if r.has("interleave_moe_layer_step") and moe != derived:
        raise r.error(f"conflicting fields 'moe_layers' and 'interleave_moe_layer_step'={step}")
    r.ignore("use_qk_norm")  # an L2 norm without weights
    interval = r.int("no_rope_layer_interval", default=4)
    rope = r.int_list("no_rope_layers") or tuple(int((i + 1) % interval != 0) for i in range(layers))
    chunk = r.int("attention_chunk_size", default=0, minimum=0)
    windowed = windowed_layers(r, layers, [bool(chunk) and bool(v) for v in rope])
    spec.update(ffn_size=r.int("intermediate_size_mlp"), expert_ffn_size=r.int("intermediate_size"),
                num_experts=r.int("num_local_experts"), top_k=r.int("num_experts_per_tok"), num_shared_experts=1,
                attention_bias=r.flag("attention_bias", False), moe_layers=moe)
    if windowed and chunk:  # a chunk-local layer sees at most chunk tokens (the window is its upper bound)
        spec.update(sliding_window=chunk, window_layers=tuple(windowed))
    return spec


def parse_glm4_moe(r: Reader) -> dict[str, Any]:
    """GLM-4.5 / 4.6 (``glm4_moe``): GQA with q/k/v biases (``attention_bias``; o_proj has none) and
    optional per-head q/k RMSNorm (``use_qk_norm``), ``first_k_dense_replace`` dense layers, then MoE
    layers of routed + shared experts behind a sigmoid router with a correction bias (HF ``Glm4MoeTopkRouter``
    always carries ``e_score_correction_bias``). Partial rotary and the router's grouping and scaling change
    no shape (ignored)."""
    spec = _base(r)
    r.ignore("num_nextn_predict_layers", "partial_rotary_factor", "n_group", "topk_group", "routed_scaling_factor",
             "norm_topk_prob", "topk_method", "moe_router_dtype")
    if r.int("decoder_sparse_step", default=1) != 1:  # HF's Glm4Moe makes every layer after the dense ones MoE
        raise r.error("field 'decoder_sparse_step' other than 1 is not how glm4_moe lays out its MoE layers")
    spec.update(ffn_size=r.int("intermediate_size"), qkv_bias=r.flag("attention_bias", False),
                qk_norm="head" if r.flag("use_qk_norm", False) else "none",
                num_experts=r.int("n_routed_experts"), top_k=r.int("num_experts_per_tok"),
                num_shared_experts=r.int("n_shared_experts", default=0, minimum=0),
                expert_ffn_size=r.int("moe_intermediate_size"),
                dense_first_layers=r.int("first_k_dense_replace", default=0, minimum=0), router_bias=True)
    return spec


def parse_minimax_m2(r: Reader) -> dict[str, Any]:
    """MiniMax-M2: GQA with full-width q/k RMSNorm, every layer MoE with a biased sigmoid router."""
    spec = _base(r)
    layers = spec["num_layers"]
    kinds = r.int_list("attn_type_list", default=(1,) * layers)
    linear = [i for i, k in enumerate(kinds) if k != 1]
    if linear:
        raise r.error(f"field 'attn_type_list' marks {len(linear)} lightning linear-attention layers "
                      f"(first {linear[0]}), which the cost model does not express")
    expert = r.int("intermediate_size")
    r.ignore("num_mtp_modules", "mtp_transformer_layers", "use_mtp")
    qk = "none"
    if r.flag("use_qk_norm", False):
        qk = "layer" if r.cfg.get("qk_norm_type", "per_layer") == "per_layer" else "head"
        r.ignore("qk_norm_type")
    spec.update(ffn_size=expert, expert_ffn_size=expert, num_experts=r.int("num_local_experts"),
                top_k=r.int("num_experts_per_tok"), router_bias=r.flag("use_routing_bias", False),
                num_shared_experts=_shared_experts(r, "shared_intermediate_size", expert),
                attention_bias=r.flag("attention_bias", False), qk_norm=qk)
    size = r.int("sliding_window", default=0, minimum=0)
    if size:
        spec.update(sliding_window=size, window_layers=tuple(range(layers)))
    return spec
