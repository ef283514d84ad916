"""A model's shape: transformer dimensions and parameter counts (:class:`ModelSpec`).

A :class:`ModelSpec` holds the shape of a decoder-only transformer (dense, MoE, GQA or DeepSeek MLA,
with an explicit per-layer MoE pattern and optional sliding-window layers) and counts its parameters
per layer kind, in elements (multiply by the bytes per element of a precision for a size in bytes).
Presets live in ``simcore/models/configs/<name>.json``, copies of the published Hugging Face configs
plus an optional ``_published_params`` key that tests check against; nothing is downloaded at run
time. The readers of each family's ``config.json`` are in :mod:`simcore.models.hf_config`; which preset a
published model id names, in :mod:`simcore.models.ids`.

Examples
--------
>>> from simcore.models import get_model
>>> spec = get_model("llama-3.1-70b")
>>> spec.kv_cache_elements_per_token()
163840
>>> round(get_model("mixtral-8x7b").active_params() / 1e9, 1)
12.9
>>> get_model("gpt-oss-120b").attention_context(4096.0)  # 18 layers at 4096, 18 at the 128 window
2112.0
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from simcore.models import linear_attention as gdn
from simcore.models import sparse_attention as dsa
from simcore.models.reader import SPEC_TYPE

__all__ = ["ModelSpec", "CHECKPOINT_DTYPES"]

_POSITIVE = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_size", "vocab_size",
             "moe_layer_freq")
_NON_NEGATIVE = ("num_experts", "top_k", "num_shared_experts", "expert_ffn_size", "dense_first_layers",
                 "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "published_params", "norms_per_layer", "max_position_embeddings", "sliding_window",
                 "index_topk", "index_n_heads", "index_head_dim")
_QK_NORMS = ("none", "head", "layer")
#: values of :attr:`ModelSpec.checkpoint_dtype` (``""``: not stated)
CHECKPOINT_DTYPES = ("", "bf16", "fp16", "fp32", "fp8", "mxfp4", "nvfp4", "int4_g32", "int4_g128")


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer; all sizes are element counts, not bytes.

    ``ffn_size`` is the dense MLP intermediate size (dense models and the dense layers of an MoE
    model); ``expert_ffn_size`` is the intermediate size of one routed or shared expert. Which
    layers are MoE: ``moe_layers`` when given (Qwen-MoE ``mlp_only_layers`` / ``decoder_sparse_step``,
    Llama-4 interleaving), else every layer ``i >= dense_first_layers`` with ``i % moe_layer_freq == 0``
    (DeepSeek). Layers in ``window_layers`` attend to at most ``sliding_window`` past tokens (gpt-oss,
    Mistral, Llama-4's chunked layers). Layers in ``linear_layers`` mix tokens with Gated DeltaNet linear
    attention (Qwen3-Next, Qwen3.5; :mod:`simcore.models.linear_attention`) and hold a fixed state per sequence
    instead of a KV cache; the ``linear_*`` fields are its head counts and sizes. ``index_*`` > 0: DeepSeek
    sparse attention over MLA (DeepSeek-V3.2, GLM-5; :mod:`simcore.models.sparse_attention`): each query attends
    to the ``index_topk`` cached tokens a lightning indexer of ``index_n_heads`` heads of
    ``index_head_dim`` selects. For MLA models
    ``head_dim`` is the query/key head size
    (``qk_nope + qk_rope``). For other models ``v_head_dim`` may be left 0 and is then set to
    ``head_dim``, so ``q_head_dim`` and ``v_head_dim`` are valid for every model.
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
    mlp_bias: bool = False  # biases on the MLP / expert matrices (GPT-J, gpt-oss)
    lm_head_bias: bool = False  # GPT-J's lm_head has a bias
    norm_bias: bool = False  # LayerNorm with bias (GPT-J, Falcon) instead of RMSNorm
    norms_per_layer: int = 2  # GPT-J and parallel-attention Falcon-7B share one norm
    parallel_attention: bool = False  # attention and MLP read the same input (GPT-J, Falcon)
    router_bias: bool = False  # DeepSeek-V3 e_score_correction_bias, gpt-oss router bias
    moe_layer_freq: int = 1  # DeepSeek: layer i is MoE iff i >= dense_first_layers and i % freq == 0
    max_position_embeddings: int = 0  # 0 = unknown
    moe_layers: tuple[int, ...] = ()  # explicit MoE layers (overrides the two fields above)
    sliding_window: int = 0  # tokens a windowed layer attends to; 0 = no windowed layers
    window_layers: tuple[int, ...] = ()  # the layers that use the window
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head and layer
    qk_norm: str = "none"  # RMSNorm on q and k: "head" (Qwen3, per head_dim) or "layer" (MiniMax, full width)
    qkv_bias: bool = False  # biases on q/k/v but not o (Qwen2)
    shared_expert_gate: bool = False  # Qwen2-MoE: a sigmoid gate [hidden, 1] on the shared expert
    attn_output_gate: bool = False  # Qwen3-Next / Qwen3.5: q_proj also yields a sigmoid gate on the output
    linear_layers: tuple[int, ...] = ()  # Gated DeltaNet layers; the others are softmax attention
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0  # width of the depthwise causal conv1d over q, k, v
    linear_state_bytes: int = 0  # bytes per element of the recurrent state (config mamba_ssm_dtype)
    index_topk: int = 0  # DeepSeek sparse attention: cached tokens each query attends to; 0 = dense
    index_n_heads: int = 0  # ... its lightning indexer's heads
    index_head_dim: int = 0  # ... and their size (one index key of this size per cached token)
    #: the checkpoint's own weight type, as its config.json states it (``torch_dtype`` / ``dtype``, or its
    #: ``quantization_config``): ``bf16``, ``fp16``, ``fp32``, ``fp8``, a 4-bit expert format (``mxfp4``,
    #: ``nvfp4``, ``int4_g32``, ``int4_g128``), or ``""`` where the config states none or one not read here.
    #: What a deployment that names no precision serves; the cost model never reads it, so two specs of one
    #: shape compare equal whatever it says.
    checkpoint_dtype: str = dataclasses.field(default="", compare=False)

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
        self._check("qk_norm", self.qk_norm in _QK_NORMS, f"must be one of {', '.join(_QK_NORMS)}")
        self._check("checkpoint_dtype", self.checkpoint_dtype in CHECKPOINT_DTYPES,
                    f"must be one of {', '.join(repr(d) for d in CHECKPOINT_DTYPES)}")
        self._check("qkv_bias", not (self.qkv_bias and self.attention_bias),
                    "and attention_bias must not both be set (attention_bias covers q/k/v/o)")
        for field in ("moe_layers", "window_layers", "linear_layers"):
            object.__setattr__(self, field, tuple(int(i) for i in getattr(self, field)))
            layers = getattr(self, field)
            self._check(field, all(0 <= i < self.num_layers for i in layers)
                        and list(layers) == sorted(set(layers)),
                        f"must be distinct increasing layer indices in [0, {self.num_layers})")
        self._check("window_layers", bool(self.window_layers) == (self.sliding_window > 0),
                    f"must be non-empty exactly when sliding_window > 0 (sliding_window={self.sliding_window})")
        self._check_moe()
        self._check_mla()
        gdn.check(self, lambda field, requirement: self._check(field, False, requirement))
        dsa.check(self, lambda field, requirement: self._check(field, False, requirement))

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
            if self.moe_layers:
                self._check("moe_layers", self.dense_first_layers == 0 and self.moe_layer_freq == 1,
                            "conflicts with dense_first_layers / moe_layer_freq (give one or the other)")
            return
        for field in ("top_k", "num_shared_experts", "expert_ffn_size", "dense_first_layers", "moe_layers"):
            self._check(field, not getattr(self, field), "must be 0 / empty for a dense model (num_experts=0)")
        for field in ("router_bias", "shared_expert_gate"):
            self._check(field, not getattr(self, field), "must be False for a dense model")

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

    @functools.cached_property  # the cost model asks often; a frozen spec never changes
    def _moe_pattern(self) -> tuple[bool, ...]:
        if not self.is_moe:
            return (False,) * self.num_layers
        if self.moe_layers:
            explicit = set(self.moe_layers)
            return tuple(i in explicit for i in range(self.num_layers))
        return tuple(i >= self.dense_first_layers and i % self.moe_layer_freq == 0 for i in range(self.num_layers))

    def layer_is_moe(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has a routed-expert MLP."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"ModelSpec {self.name}: layer must be in [0, {self.num_layers}), got {layer!r}")
        return self._moe_pattern[layer]

    @functools.cached_property
    def num_moe_layers(self) -> int:
        return sum(self._moe_pattern)

    @functools.cached_property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def is_hybrid(self) -> bool:
        """Whether some layers use linear attention (Gated DeltaNet) instead of softmax attention."""
        return bool(self.linear_layers)

    @property
    def is_sparse_attention(self) -> bool:
        """Whether attention is DeepSeek sparse attention (a lightning indexer picks ``index_topk`` keys)."""
        return self.index_topk > 0

    @property
    def num_attention_layers(self) -> int:
        """Layers with softmax attention over a KV cache."""
        return self.num_layers - len(self.linear_layers)

    def layer_is_linear(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) mixes tokens with linear attention."""
        return layer in self._linear_set

    @functools.cached_property
    def _linear_set(self) -> frozenset[int]:
        return frozenset(self.linear_layers)

    def dense_layers_before(self) -> np.ndarray:
        """``out[i]`` = dense layers among the first ``i`` (length ``num_layers + 1``), for stage splits."""
        return np.concatenate([[0], np.cumsum([not moe for moe in self._moe_pattern])]).astype(np.int64)

    # ------------------------------------------------------------ attention span
    def attention_context(self, context):
        """Mean over softmax-attention layers of the tokens one decode step attends to at ``context``
        (scalar or array).

        A windowed layer attends to ``min(context, sliding_window)``, the others to ``context``; the
        same mean sizes the KV cache a layer holds. Equals ``context`` for a model without windows.
        """
        n_win = len(self.window_layers)
        if n_win == 0:
            return context
        windowed = np.minimum(context, float(self.sliding_window))
        n = self.num_attention_layers
        mean = ((n - n_win) * np.asarray(context, dtype=float) + n_win * windowed) / n
        return float(mean) if np.ndim(mean) == 0 else mean

    def attended_context(self, context):
        """Mean over softmax-attention layers of the cached tokens one decode query attends to at
        ``context``: :meth:`attention_context`, capped at ``index_topk`` under DeepSeek sparse attention
        (whose layers still hold every token)."""
        return dsa.attended(self, self.attention_context(context))

    def prefill_attention_pairs(self, seq_len: float) -> float:
        """Mean over softmax-attention layers of the causal (query, key) pairs of a prefill of
        ``seq_len`` tokens (each query keeps at most ``index_topk`` keys under sparse attention)."""
        if self.is_sparse_attention:
            return dsa.prefill_pairs(self, seq_len)
        full = seq_len * seq_len / 2.0
        n_win = len(self.window_layers)
        if n_win == 0 or seq_len <= self.sliding_window:
            return full
        w = float(self.sliding_window)
        windowed = w * seq_len - w * w / 2.0
        n = self.num_attention_layers
        return ((n - n_win) * full + n_win * windowed) / n

    # ---------------------------------------------------------- parameter counts
    def attention_params(self) -> int:
        """One layer's attention (elements): projections, MLA's internal norms, q/k norms, sinks, biases."""
        extra = (self.num_heads if self.attention_sinks else 0) + self._qk_norm_params()
        h, heads = self.hidden_size, self.num_heads
        if not self.is_mla:
            q, kv = heads * self.head_dim, self.num_kv_heads * self.head_dim
            q_out = q * (2 if self.attn_output_gate else 1)  # the output gate comes out of q_proj
            bias = 0
            if self.attention_bias or self.qkv_bias:  # q, k, v biases; o's only with attention_bias
                bias = q_out + 2 * kv + (h if self.attention_bias else 0)
            return h * (q_out + 2 * kv) + q * h + bias + extra
        q_out = heads * self.q_head_dim
        if self.q_lora_rank:  # q_a_proj, q_a_layernorm, q_b_proj
            q_params = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_out
        else:
            q_params = h * q_out
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank  # incl. kv_a_layernorm
        kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        o = heads * self.v_head_dim * h
        bias = self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim + h if self.attention_bias else 0
        return q_params + kv_a + kv_b + o + bias + extra + dsa.indexer_params(self)

    def linear_attention_params(self) -> int:
        """One Gated DeltaNet token mixer (elements); 0 for a model without linear attention."""
        return gdn.layer_params(self) if self.is_hybrid else 0

    def _qk_norm_params(self) -> int:
        if self.qk_norm == "head":
            return 2 * self.head_dim
        if self.qk_norm == "layer":
            return (self.num_heads + self.num_kv_heads) * self.head_dim
        return 0

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
        """One MoE layer's router / gate (elements), incl. a shared-expert gate; 0 for a dense model."""
        if not self.is_moe:
            return 0
        bias = self.num_experts if self.router_bias else 0
        return self.num_experts * self.hidden_size + bias + (self.hidden_size if self.shared_expert_gate else 0)

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
        mixer = self.linear_attention_params() if self.layer_is_linear(layer) else self.attention_params()
        return mixer + self.norm_params() + mlp

    def _params(self, active: bool) -> int:
        outside = self.embedding_params() + self.lm_head_params() + self._one_norm()  # + final norm
        return outside + sum(self.layer_params(i, active=active) for i in range(self.num_layers))

    def total_params(self) -> int:
        """Every parameter (elements): embeddings, layers, norms, lm_head (MTP and vision modules excluded)."""
        return self._params(active=False)

    def active_params(self) -> int:
        """Parameters touched per token (elements): top_k routed + shared experts, embeddings included."""
        return self._params(active=True)

    def kv_cache_elements_per_token(self) -> int:
        """KV-cache elements per token over all softmax-attention layers (MLA caches the latent plus
        the rope key); linear-attention layers hold :meth:`linear_state_bytes_per_sequence` instead.

        Per token of a context no longer than every window; a windowed layer holds at most
        ``sliding_window`` tokens (see :meth:`attention_context`)."""
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_attention_layers
        return 2 * self.num_kv_heads * self.head_dim * self.num_attention_layers

    def kv_cache_bytes_per_token(self, kv_bytes: float) -> float:
        """KV-cache bytes per token over all layers at ``kv_bytes`` per element, plus the index keys of
        DeepSeek sparse attention (FP8 whatever ``kv_bytes``: :func:`simcore.models.sparse_attention.key_bytes`)."""
        return self.kv_cache_elements_per_token() * kv_bytes + self.num_attention_layers * dsa.key_bytes(self)

    def linear_state_bytes_per_sequence(self, activation_bytes: float = 2.0) -> float:
        """Bytes of fixed state (conv + recurrent) one sequence holds over the linear-attention layers,
        whatever its length; 0 without linear attention."""
        return gdn.state_bytes_per_sequence(self, activation_bytes)

    def to_dict(self) -> dict[str, Any]:
        """A config dict (``model_type`` ``"simcore_spec"``) that :func:`from_hf_config` reads back."""
        return {"model_type": SPEC_TYPE, **dataclasses.asdict(self)}
