"""Readers of Hugging Face ``config.json`` files, one per model family, into :class:`~simcore.models.spec.ModelSpec`.

Families: llama / mistral / mixtral / qwen2 / qwen3 (:mod:`simcore.models.moe_families` holds the MoE ones:
qwen2_moe / qwen3_moe, deepseek_v2 / v3 / kimi_k2, gpt_oss, llama4, minimax_m2, and the Gated DeltaNet
hybrids qwen3_next / qwen3_5 / qwen3_5_moe), falcon, gptj. A multimodal config is read through its
``text_config`` (flat or nested). Nothing is guessed in silence:

- an architecture whose cost the catalog cannot express (other linear attentions, state-space layers)
  is refused by name (:data:`REJECTED`); DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) is read
  (:mod:`simcore.models.sparse_attention`);
- after a family has read its fields, any structural field left unread (experts, MoE layout,
  windows, linear attention...) is an error naming it, so a Qwen3-MoE config can no longer load as a
  dense model. An unknown ``model_type`` is read with llama keys under the same rule.

Every failure is a one-line :class:`ModelConfigError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from simcore.models import moe_families as fam
from simcore.models.reader import (
    MISSING,
    REJECTED,
    SPEC_TYPE,
    ModelConfigError,
    Reader,
    qwen_attention,
    short,
    window,
)
from simcore.models.spec import ModelSpec

__all__ = ["ModelConfigError", "from_hf_config", "REJECTED", "SPEC_TYPE"]

def _common(r: Reader) -> dict[str, Any]:
    return {"published_params": r.number("_published_params", 0.0),
            "max_position_embeddings": r.int("max_position_embeddings", "n_positions", default=0, minimum=0),
            "checkpoint_dtype": _checkpoint_dtype(r)}


#: ``torch_dtype`` (``dtype`` in newer configs) -> :attr:`ModelSpec.checkpoint_dtype`
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _checkpoint_dtype(r: Reader) -> str:
    """The checkpoint's weight type (:attr:`ModelSpec.checkpoint_dtype`): its ``quantization_config``'s where
    it has one (``quant_method: fp8`` and ModelOpt ``quant_algo: FP8``: ``fp8``; ``mxfp4``; ModelOpt
    ``NVFP4``; compressed-tensors 4-bit weight groups of 32 or 128, or 8-bit float weights), else its
    ``torch_dtype``; ``""`` where neither says (a quantization not listed here is not read as the dtype)."""
    r.ignore("quantization_config", "torch_dtype", "dtype")
    quant = r.cfg.get("quantization_config")
    if isinstance(quant, Mapping) and quant:
        method, algo = str(quant.get("quant_method", "")).lower(), str(quant.get("quant_algo", "")).upper()
        if method in ("fp8", "mxfp4"):
            return method
        if algo in ("FP8", "NVFP4"):
            return algo.lower()
        if method == "compressed-tensors":
            for group in (quant.get("config_groups") or {}).values():
                weights = (group or {}).get("weights") or {}
                if weights.get("num_bits") == 4 and weights.get("group_size") in (32, 128):
                    return f"int4_g{weights['group_size']}"
                if weights.get("num_bits") == 8 and weights.get("type") == "float":
                    return "fp8"
        return ""
    return _TORCH_DTYPES.get(str(r.cfg.get("torch_dtype") or r.cfg.get("dtype") or ""), "")



def _parse_llama(r: Reader) -> dict[str, Any]:
    """Llama, Mistral, Mixtral (``intermediate_size`` is then the expert size), Qwen2/Qwen3 dense."""
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    ffn, layers = r.int("intermediate_size"), r.int("num_hidden_layers")
    spec = {"num_layers": layers, "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": r.int("num_key_value_heads", default=heads),
            "head_dim": r.head_dim(hidden, heads, "num_attention_heads"), "ffn_size": ffn,
            "vocab_size": r.int("vocab_size"), "tied_embeddings": r.flag("tie_word_embeddings", False),
            "attention_bias": r.flag("attention_bias", False), "mlp_bias": r.flag("mlp_bias", False)}
    model_type = r.cfg.get("model_type")
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        spec.update(qwen_attention(r, layers))
    else:
        spec.update(window(r, layers, range(layers)))  # Mistral v0.1: every layer
    if r.has("num_local_experts"):
        spec.update(num_experts=r.int("num_local_experts"), top_k=r.int("num_experts_per_tok"),
                    expert_ffn_size=ffn)
    return spec



def _parse_gptj(r: Reader) -> dict[str, Any]:
    """GPT-J: parallel attention + GeLU MLP with biases, one LayerNorm per layer, biased lm_head."""
    hidden, heads = r.int("n_embd"), r.int("n_head")
    return {"num_layers": r.int("n_layer"), "hidden_size": hidden, "num_heads": heads, "num_kv_heads": heads,
            "head_dim": r.head_dim(hidden, heads, "n_head"), "ffn_size": r.int("n_inner", default=4 * hidden),
            "vocab_size": r.int("vocab_size"), "tied_embeddings": r.flag("tie_word_embeddings", False),
            "gated_mlp": False, "mlp_bias": True, "lm_head_bias": True, "norm_bias": True,
            "norms_per_layer": 1, "parallel_attention": True}


def _parse_falcon(r: Reader) -> dict[str, Any]:
    """Falcon / RefinedWeb: GeLU MLP, LayerNorm with bias, tied embeddings by default."""
    hidden, heads = r.int("hidden_size", "n_embd"), r.int("num_attention_heads", "n_head")
    new_arch = r.flag("new_decoder_architecture", r.cfg.get("model_type") == "RefinedWeb")
    parallel = r.flag("parallel_attn", True)
    if new_arch:
        kv_heads = r.int("num_kv_heads", "n_head_kv", default=heads)
        norms = r.int("num_ln_in_parallel_attn", default=2)
    else:
        kv_heads = 1 if r.flag("multi_query", True) else heads
        norms = 1 if parallel else 2
    bias = r.flag("bias", False)
    return {"num_layers": r.int("num_hidden_layers", "n_layer"), "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": kv_heads, "head_dim": r.head_dim(hidden, heads, "num_attention_heads"),
            "ffn_size": r.int("ffn_hidden_size", default=4 * hidden), "vocab_size": r.int("vocab_size"),
            "tied_embeddings": r.flag("tie_word_embeddings", True), "gated_mlp": False,
            "attention_bias": bias, "mlp_bias": bias, "norm_bias": True, "norms_per_layer": norms,
            "parallel_attention": parallel}


def _parse_spec(r: Reader) -> dict[str, Any]:
    """The output of :meth:`ModelSpec.to_dict`: dataclass fields verbatim, type-checked."""
    fields = {f.name: f for f in dataclasses.fields(ModelSpec) if f.name != "name"}
    unknown = set(r.cfg) - set(fields) - {"model_type", "name"}
    if unknown:
        raise r.error(f"unknown field(s) {', '.join(sorted(unknown))} for model_type {SPEC_TYPE!r}")
    out: dict[str, Any] = {}
    for key, field in fields.items():
        required = field.default is dataclasses.MISSING
        if field.type == "bool":
            out[key] = r.flag(key, field.default)
        elif field.type == "float":
            out[key] = r.number(key, field.default)
        elif field.type == "str":
            out[key] = str(r.cfg.get(key, field.default))
        elif field.type.startswith("tuple"):
            out[key] = r.int_list(key, field.default)
        else:
            out[key] = r.int(key, default=MISSING if required else field.default, minimum=int(required))
    r.ignore(*r.cfg)
    return out


def _parsers() -> dict[str, Callable[[Reader], dict[str, Any]]]:
    llama = {t: _parse_llama for t in ("llama", "mistral", "mixtral", "qwen2", "qwen3")}
    return {**llama, "gptj": _parse_gptj, "falcon": _parse_falcon, "RefinedWeb": _parse_falcon,
            "RefinedWebModel": _parse_falcon, "deepseek_v3": fam.parse_deepseek, "deepseek_v2": fam.parse_deepseek,
            "kimi_k2": fam.parse_deepseek, "deepseek_v32": fam.parse_deepseek, "glm_moe_dsa": fam.parse_deepseek,
            "qwen2_moe": fam.parse_qwen_moe, "qwen3_moe": fam.parse_qwen_moe,
            "gpt_oss": fam.parse_gpt_oss, "llama4_text": fam.parse_llama4, "minimax_m2": fam.parse_minimax_m2,
            "glm4_moe": fam.parse_glm4_moe,
            **dict.fromkeys(fam.QWEN_HYBRID_TYPES, fam.parse_qwen_hybrid), SPEC_TYPE: _parse_spec}


def _load_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot read model config ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") \
            from None


def _text_model(cfg: Mapping[str, Any], reader: Reader) -> Mapping[str, Any]:
    """A multimodal config's ``text_config`` (with the outer ``_`` keys, and the outer ``model_type``
    when the inner one has none), else the config itself."""
    outer = cfg.get("model_type")
    if outer in REJECTED:
        raise reader.error(f"model_type {outer!r} has {REJECTED[outer]}, which the cost model does not express")
    inner = cfg.get("text_config")
    if not isinstance(inner, Mapping) or cfg.get("num_hidden_layers") is not None:
        return cfg
    kind = {"model_type": outer} if outer is not None and inner.get("model_type") is None else {}
    # the checkpoint's weight type, where only the outer config states it (Kimi-K2.5's quantization_config)
    weights = {k: cfg[k] for k in ("quantization_config", "torch_dtype", "dtype") if k in cfg and k not in inner}
    return {**inner, **kind, **weights, **{k: v for k, v in cfg.items() if k.startswith("_")}}


def from_hf_config(source: str | os.PathLike[str] | Mapping[str, Any], name: str | None = None):
    """Build a :class:`~simcore.models.spec.ModelSpec` from a Hugging Face ``config.json`` (path) or its dict.

    Reads the families listed in the module docstring; an unknown ``model_type`` is read with
    llama-style keys unless it has structural fields that reading would ignore. The optional
    ``_published_params`` key sets ``published_params``. The name defaults to ``name``/``_name`` in
    the dict, else the file stem, else the model type. Raises :class:`ModelConfigError` naming the
    file and field.
    """
    if isinstance(source, Mapping):
        cfg, label, stem = source, "model config <dict>", None
    else:
        path = Path(source)
        cfg, label, stem = _load_json(path), str(path), path.stem
    reader = Reader(cfg if isinstance(cfg, Mapping) else {}, label)
    if not isinstance(cfg, Mapping):
        raise reader.error(f"top level must be a JSON object, got {type(cfg).__name__}")
    cfg = _text_model(cfg, reader)
    reader = Reader(cfg, label)
    model_type = cfg.get("model_type", "llama")
    if not isinstance(model_type, str):
        raise reader.error(f"field 'model_type' must be a string, got {short(model_type)}")
    if model_type in REJECTED:
        raise reader.error(f"model_type {model_type!r} has {REJECTED[model_type]}, "
                           "which the cost model does not express")
    spec_name = name or cfg.get("name") or cfg.get("_name") or stem or model_type
    fields = {**_common(reader), **_parsers().get(model_type, _parse_llama)(reader)}
    unread = reader.unread_structural()
    if unread:
        raise reader.error(f"field(s) {', '.join(unread)} not understood for model_type {model_type!r}; "
                           "reading the config without them would model another network")
    try:
        return ModelSpec(name=str(spec_name), **fields)
    except (TypeError, ValueError) as exc:
        raise reader.error(str(exc).splitlines()[0]) from None

