"""Model catalog: transformer shapes and parameter counts, read from Hugging Face ``config.json`` files.

A :class:`ModelSpec` holds the shape of a decoder-only transformer (dense, MoE, GQA or DeepSeek MLA)
and counts its parameters per layer kind, in elements (multiply by the bytes per element of a
precision for a size in bytes). Presets live in ``simcore/model_configs/<name>.json``, copies of the
published Hugging Face configs plus an optional ``_published_params`` key that tests check against;
nothing is downloaded at run time.

Examples
--------
>>> spec = get_model("llama-3.1-70b")
>>> spec.kv_cache_elements_per_token()
163840
>>> round(get_model("mixtral-8x7b").active_params() / 1e9, 1)
12.9
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelSpec", "ModelConfigError", "from_hf_config", "get_model", "MODEL_NAMES", "CONFIG_DIR"]

#: Directory holding the preset ``<name>.json`` files.
CONFIG_DIR = Path(__file__).with_name("model_configs")

MODEL_NAMES: tuple[str, ...] = (
    "gpt-j-6b", "llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b",
    "llama-3.1-70b", "llama-3.1-405b", "mistral-7b", "falcon-180b", "mixtral-8x7b", "mixtral-8x22b",
    "deepseek-v3", "gpt-moe-1.2t", "gpt-moe-1.6t",
)

_POSITIVE = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_size", "vocab_size",
             "moe_layer_freq")
_NON_NEGATIVE = ("num_experts", "top_k", "num_shared_experts", "expert_ffn_size", "dense_first_layers",
                 "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "published_params", "norms_per_layer", "max_position_embeddings")


class ModelConfigError(ValueError):
    """A model config file or dict that cannot be turned into a :class:`ModelSpec` (one-line message)."""


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer; all sizes are element counts, not bytes.

    ``ffn_size`` is the dense MLP intermediate size (dense models and the dense-first layers of
    an MoE model); ``expert_ffn_size`` is the intermediate size of one routed or shared expert.
    For MLA models ``head_dim`` is the query/key head size (``qk_nope + qk_rope``). For other
    models ``v_head_dim`` may be left 0 and is then set to ``head_dim``, so ``q_head_dim`` and
    ``v_head_dim`` are valid for every model.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    num_experts: int = 0
    top_k: int = 0
    num_shared_experts: int = 0
    expert_ffn_size: int = 0
    dense_first_layers: int = 0
    gated_mlp: bool = True
    tied_embeddings: bool = False
    attention_bias: bool = False  # biases on q/k/v/o (MLA: on q_a, kv_a and o)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    published_params: float = 0.0
    mlp_bias: bool = False  # biases on the MLP / expert matrices (GPT-J)
    lm_head_bias: bool = False  # GPT-J's lm_head has a bias
    norm_bias: bool = False  # LayerNorm with bias (GPT-J, Falcon) instead of RMSNorm
    norms_per_layer: int = 2  # GPT-J and parallel-attention Falcon-7B share one norm
    parallel_attention: bool = False  # attention and MLP read the same input (GPT-J, Falcon)
    router_bias: bool = False  # DeepSeek-V3 e_score_correction_bias
    moe_layer_freq: int = 1  # DeepSeek: layer i is MoE iff i >= dense_first_layers and i % freq == 0
    max_position_embeddings: int = 0  # 0 = unknown

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ModelSpec: name must be a non-empty string, got {self.name!r}")
        for field in _POSITIVE:
            self._check(field, getattr(self, field) > 0, "must be positive")
        for field in _NON_NEGATIVE:
            self._check(field, getattr(self, field) >= 0, "must be >= 0")
        self._check("num_kv_heads", self.num_heads % self.num_kv_heads == 0,
                    f"must divide num_heads={self.num_heads}")
        self._check("dense_first_layers", self.dense_first_layers <= self.num_layers,
                    f"must be <= num_layers={self.num_layers}")
        self._check_moe()
        self._check_mla()

    def _check(self, field: str, ok: bool, requirement: str) -> None:
        if not ok:
            raise ValueError(f"ModelSpec {self.name}: {field} {requirement}, got {getattr(self, field)!r}")

    def _check_moe(self) -> None:
        if self.num_experts > 0:
            self._check("top_k", 1 <= self.top_k <= self.num_experts,
                        f"must be in [1, num_experts={self.num_experts}]")
            self._check("expert_ffn_size", self.expert_ffn_size > 0, "must be positive for an MoE model")
            self._check("dense_first_layers", self.dense_first_layers < self.num_layers,
                        "must leave at least one MoE layer")
            return
        for field in ("top_k", "num_shared_experts", "expert_ffn_size", "dense_first_layers"):
            self._check(field, getattr(self, field) == 0, "must be 0 for a dense model (num_experts=0)")
        self._check("router_bias", not self.router_bias, "must be False for a dense model")

    def _check_mla(self) -> None:
        if self.kv_lora_rank > 0:
            for field in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                self._check(field, getattr(self, field) > 0, "must be positive for an MLA model")
            return
        for field in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"):
            self._check(field, getattr(self, field) == 0, "must be 0 without MLA (kv_lora_rank=0)")
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        self._check("v_head_dim", self.v_head_dim == self.head_dim,
                    f"must equal head_dim={self.head_dim} without MLA")

    # ----------------------------------------------------------------- structure
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_head_dim(self) -> int:
        """Query (and key) head size: ``qk_nope + qk_rope`` for MLA, else ``head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    def layer_is_moe(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has a routed-expert MLP."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"ModelSpec {self.name}: layer must be in [0, {self.num_layers}), got {layer!r}")
        return self.is_moe and layer >= self.dense_first_layers and layer % self.moe_layer_freq == 0

    @functools.cached_property  # the cost model asks often; a frozen spec never changes
    def num_moe_layers(self) -> int:
        return sum(self.layer_is_moe(layer) for layer in range(self.num_layers))

    @functools.cached_property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---------------------------------------------------------- parameter counts
    def attention_params(self) -> int:
        """One layer's attention projections (elements), incl. MLA's internal norms and any biases."""
        h, heads = self.hidden_size, self.num_heads
        if not self.is_mla:
            q, kv = heads * self.head_dim, self.num_kv_heads * self.head_dim
            bias = q + 2 * kv + h if self.attention_bias else 0
            return h * (q + 2 * kv) + q * h + bias
        q_out = heads * self.q_head_dim
        if self.q_lora_rank:  # q_a_proj, q_a_layernorm, q_b_proj
            q_params = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_out
        else:
            q_params = h * q_out
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank  # incl. kv_a_layernorm
        kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        o = heads * self.v_head_dim * h
        bias = self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim + h if self.attention_bias else 0
        return q_params + kv_a + kv_b + o + bias

    def _mlp_params(self, intermediate: int) -> int:
        matrices = 3 if self.gated_mlp else 2
        bias = (matrices - 1) * intermediate + self.hidden_size if self.mlp_bias else 0
        return matrices * self.hidden_size * intermediate + bias

    def dense_mlp_params(self) -> int:
        """One dense MLP (elements)."""
        return self._mlp_params(self.ffn_size)

    def expert_params(self) -> int:
        """One routed expert, equal to one shared expert (elements); 0 for a dense model."""
        return self._mlp_params(self.expert_ffn_size) if self.is_moe else 0

    def router_params(self) -> int:
        """One MoE layer's router / gate (elements); 0 for a dense model."""
        if not self.is_moe:
            return 0
        return self.num_experts * self.hidden_size + (self.num_experts if self.router_bias else 0)

    def norm_params(self) -> int:
        """The layer norms of one layer, outside attention (elements)."""
        return self.norms_per_layer * self._one_norm()

    def _one_norm(self) -> int:
        return self.hidden_size * (2 if self.norm_bias else 1)

    def embedding_params(self) -> int:
        """Input token embedding (elements)."""
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        """Output projection (elements); its weight is 0 when tied to the embedding."""
        weight = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return weight + (self.vocab_size if self.lm_head_bias else 0)

    def layer_params(self, layer: int, *, active: bool = False) -> int:
        """All parameters of one layer; ``active=True`` counts only top_k + shared experts."""
        if self.layer_is_moe(layer):
            experts = self.top_k if active else self.num_experts
            mlp = (experts + self.num_shared_experts) * self.expert_params() + self.router_params()
        else:
            mlp = self.dense_mlp_params()
        return self.attention_params() + self.norm_params() + mlp

    def _params(self, active: bool) -> int:
        outside = self.embedding_params() + self.lm_head_params() + self._one_norm()  # + final norm
        return outside + sum(self.layer_params(i, active=active) for i in range(self.num_layers))

    def total_params(self) -> int:
        """Every parameter (elements): embeddings, layers, norms, lm_head (MTP modules excluded)."""
        return self._params(active=False)

    def active_params(self) -> int:
        """Parameters touched per token (elements): top_k routed + shared experts, embeddings included."""
        return self._params(active=True)

    def kv_cache_elements_per_token(self) -> int:
        """KV-cache elements per token over all layers (MLA caches the latent plus the rope key)."""
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers
        return 2 * self.num_kv_heads * self.head_dim * self.num_layers

    def to_dict(self) -> dict[str, Any]:
        """A config dict (``model_type`` ``"simcore_spec"``) that :func:`from_hf_config` reads back."""
        return {"model_type": _SPEC_TYPE, **dataclasses.asdict(self)}


# ====================================================================== parsing
_SPEC_TYPE = "simcore_spec"
_MISSING = object()


class _Reader:
    """Typed access to one config dict; every failure is a one-line :class:`ModelConfigError`."""

    def __init__(self, cfg: Mapping[str, Any], label: str) -> None:
        self.cfg, self.label = cfg, label

    def error(self, message: str) -> ModelConfigError:
        return ModelConfigError(f"{self.label}: {message}")

    def _lookup(self, keys: tuple[str, ...], default: Any) -> tuple[str, Any]:
        for key in keys:
            if self.cfg.get(key) is not None:
                return key, self.cfg[key]
        if default is _MISSING:
            raise self.error(f"field {keys[0]!r} is missing" + (f" (also tried {', '.join(keys[1:])})"
                                                               if len(keys) > 1 else ""))
        return keys[0], default

    def int(self, *keys: str, default: Any = _MISSING, minimum: int = 1) -> int:
        """The first present key among ``keys`` as an int >= ``minimum``."""
        key, value = self._lookup(keys, default)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.error(f"field {key!r} must be {kind}, got {_short(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        _, value = self._lookup((key,), default)
        if not isinstance(value, bool):
            raise self.error(f"field {key!r} must be true or false, got {_short(value)}")
        return value

    def number(self, key: str, default: float) -> float:
        _, value = self._lookup((key,), default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.error(f"field {key!r} must be a non-negative number, got {_short(value)}")
        return float(value)

    def head_dim(self, hidden: int, heads: int, heads_key: str) -> int:
        if self.cfg.get("head_dim") is not None:
            return self.int("head_dim")
        if hidden % heads:
            raise self.error(f"field {heads_key!r}={heads} does not divide hidden size {hidden}")
        return hidden // heads


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _common(r: _Reader) -> dict[str, Any]:
    return {"published_params": r.number("_published_params", 0.0),
            "max_position_embeddings": r.int("max_position_embeddings", "n_positions", default=0, minimum=0)}


def _parse_llama(r: _Reader) -> dict[str, Any]:
    """Llama, Mistral, Mixtral (``intermediate_size`` is then the expert size) and unknown types."""
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    ffn = r.int("intermediate_size")
    spec = {"num_layers": r.int("num_hidden_layers"), "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": r.int("num_key_value_heads", default=heads),
            "head_dim": r.head_dim(hidden, heads, "num_attention_heads"), "ffn_size": ffn,
            "vocab_size": r.int("vocab_size"), "tied_embeddings": r.flag("tie_word_embeddings", False),
            "attention_bias": r.flag("attention_bias", False), "mlp_bias": r.flag("mlp_bias", False)}
    if r.cfg.get("num_local_experts") is not None:
        spec.update(num_experts=r.int("num_local_experts"), top_k=r.int("num_experts_per_tok"),
                    expert_ffn_size=ffn)
    return spec


def _parse_gptj(r: _Reader) -> dict[str, Any]:
    """GPT-J: parallel attention + GeLU MLP with biases, one LayerNorm per layer, biased lm_head."""
    hidden, heads = r.int("n_embd"), r.int("n_head")
    return {"num_layers": r.int("n_layer"), "hidden_size": hidden, "num_heads": heads, "num_kv_heads": heads,
            "head_dim": r.head_dim(hidden, heads, "n_head"), "ffn_size": r.int("n_inner", default=4 * hidden),
            "vocab_size": r.int("vocab_size"), "tied_embeddings": r.flag("tie_word_embeddings", False),
            "gated_mlp": False, "mlp_bias": True, "lm_head_bias": True, "norm_bias": True,
            "norms_per_layer": 1, "parallel_attention": True}


def _parse_falcon(r: _Reader) -> dict[str, Any]:
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


def _parse_deepseek(r: _Reader) -> dict[str, Any]:
    """DeepSeek-V2/V3: MLA attention, shared + routed experts after ``first_k_dense_replace`` dense layers."""
    heads = r.int("num_attention_heads")
    nope, rope = r.int("qk_nope_head_dim"), r.int("qk_rope_head_dim")
    spec = {"num_layers": r.int("num_hidden_layers"), "hidden_size": r.int("hidden_size"), "num_heads": heads,
            "num_kv_heads": r.int("num_key_value_heads", default=heads), "head_dim": nope + rope,
            "ffn_size": r.int("intermediate_size"), "vocab_size": r.int("vocab_size"),
            "tied_embeddings": r.flag("tie_word_embeddings", False),
            "attention_bias": r.flag("attention_bias", False),
            "q_lora_rank": r.int("q_lora_rank", default=0, minimum=0), "kv_lora_rank": r.int("kv_lora_rank"),
            "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": r.int("v_head_dim")}
    if r.cfg.get("n_routed_experts") is not None:
        spec.update(num_experts=r.int("n_routed_experts"), top_k=r.int("num_experts_per_tok"),
                    num_shared_experts=r.int("n_shared_experts", default=0, minimum=0),
                    expert_ffn_size=r.int("moe_intermediate_size"),
                    dense_first_layers=r.int("first_k_dense_replace", default=0, minimum=0),
                    moe_layer_freq=r.int("moe_layer_freq", default=1),
                    router_bias=r.cfg.get("topk_method") == "noaux_tc")
    return spec


def _parse_spec(r: _Reader) -> dict[str, Any]:
    """The output of :meth:`ModelSpec.to_dict`: dataclass fields verbatim, type-checked."""
    fields = {f.name: f for f in dataclasses.fields(ModelSpec) if f.name != "name"}
    unknown = set(r.cfg) - set(fields) - {"model_type", "name"}
    if unknown:
        raise r.error(f"unknown field(s) {', '.join(sorted(unknown))} for model_type {_SPEC_TYPE!r}")
    out: dict[str, Any] = {}
    for key, field in fields.items():
        required = field.default is dataclasses.MISSING
        if field.type == "bool":
            out[key] = r.flag(key, field.default)
        elif field.type == "float":
            out[key] = r.number(key, field.default)
        else:
            out[key] = r.int(key, default=_MISSING if required else field.default, minimum=int(required))
    return out


_PARSERS: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "gptj": _parse_gptj, "falcon": _parse_falcon, "RefinedWeb": _parse_falcon,
    "RefinedWebModel": _parse_falcon, "deepseek_v3": _parse_deepseek, "deepseek_v2": _parse_deepseek,
    _SPEC_TYPE: _parse_spec,
}


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


def from_hf_config(source: str | os.PathLike[str] | Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` (path) or its parsed dict.

    Understands llama/mistral/mixtral, falcon (incl. RefinedWeb keys), gptj and deepseek_v2/v3;
    an unknown ``model_type`` is read with llama-style keys. The optional ``_published_params``
    key sets ``published_params``. The name defaults to ``name``/``_name`` in the dict, else the
    file stem, else the model type. Raises :class:`ModelConfigError` naming the file and field.
    """
    if isinstance(source, Mapping):
        cfg, label, stem = source, "model config <dict>", None
    else:
        path = Path(source)
        cfg, label, stem = _load_json(path), str(path), path.stem
    reader = _Reader(cfg if isinstance(cfg, Mapping) else {}, label)
    if not isinstance(cfg, Mapping):
        raise reader.error(f"top level must be a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type", "llama")
    if not isinstance(model_type, str):
        raise reader.error(f"field 'model_type' must be a string, got {_short(model_type)}")
    spec_name = name or cfg.get("name") or cfg.get("_name") or stem or model_type
    fields = {**_common(reader), **_PARSERS.get(model_type, _parse_llama)(reader)}
    try:
        return ModelSpec(name=str(spec_name), **fields)
    except (TypeError, ValueError) as exc:
        raise reader.error(str(exc).splitlines()[0]) from None


@functools.cache
def _preset(name: str) -> ModelSpec:
    return from_hf_config(CONFIG_DIR / f"{name}.json", name=name)


def get_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """A preset by name (case-insensitive, see :data:`MODEL_NAMES`) or a ``config.json`` path."""
    text = os.fspath(name_or_path)
    if text.lower() in MODEL_NAMES:
        return _preset(text.lower())
    if text.endswith(".json") or os.sep in text or Path(text).is_file():
        return from_hf_config(text)
    raise ValueError(f"unknown model {text!r}; valid names: {', '.join(MODEL_NAMES)}")
