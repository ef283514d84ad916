"""Typed, one-line-error access to a Hugging Face ``config.json`` dict, shared by every family's reader.

:class:`Reader` records which fields a family read, so a structural field left unread is an error
(:mod:`simcore.models.hf_config`); :data:`REJECTED` names the architectures the cost model refuses.
The attention-layout helpers (:func:`windowed_layers`, :func:`window`, :func:`qwen_attention`) are
shared by the dense and the MoE families.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["ModelConfigError", "REJECTED", "SPEC_TYPE", "MISSING", "Reader", "qwen_attention", "window",
           "windowed_layers", "short"]

SPEC_TYPE = "simcore_spec"
MISSING = object()

#: model_type -> why the catalog refuses it (its attention is not softmax attention over the KV cache).
REJECTED = {
    "minimax": "lightning linear attention", "minimax_text_01": "lightning linear attention",
    "minimax_m1": "lightning linear attention", "kimi_linear": "Kimi delta linear attention",
    "jamba": "Mamba state-space layers", "mamba": "Mamba state-space layers", "mamba2": "Mamba state-space layers",
    "falcon_h1": "Mamba state-space layers", "nemotron_h": "Mamba state-space layers",
    "zamba": "Mamba state-space layers", "zamba2": "Mamba state-space layers", "bamba": "Mamba state-space layers",
    "granitemoehybrid": "Mamba state-space layers", "lfm2": "short convolution layers",
    "recurrent_gemma": "recurrent (RG-LRU) layers", "rwkv": "RWKV recurrence",
}
# Fields that change a model's structure or cost; one left unread by its family's reader is an error.
_STRUCTURAL = re.compile(r"expert|moe|sparse|router|routing|mamba|ssm|linear|window|layer_type|lora|^index_|indexer"
                         r"|chunk|nextn|mtp|shared|dsa|attn_type|block_type|hybrid|conv|recurrent|delta")
# Read by no family on purpose: training-only losses and routing-score details that leave shapes alone.
_TRAINING_ONLY = frozenset({
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "router_z_loss_coef",
    "aux_loss_alpha", "seq_aux", "norm_topk_prob", "routed_scaling_factor", "scoring_func", "n_group",
    "topk_group", "ep_size", "moe_aux_loss_coeff",
})


class ModelConfigError(ValueError):
    """A model config file or dict that cannot be turned into a :class:`ModelSpec` (one-line message)."""


class Reader:
    """Typed access to one config dict; records what it read; every failure is a one-line error."""

    def __init__(self, cfg: Mapping[str, Any], label: str) -> None:
        self.cfg, self.label = cfg, label
        self.used: set[str] = set()

    def error(self, message: str) -> ModelConfigError:
        return ModelConfigError(f"{self.label}: {message}")

    def has(self, key: str) -> bool:
        """Whether ``key`` is present and not null (marks it read)."""
        self.used.add(key)
        return self.cfg.get(key) is not None

    def ignore(self, *keys: str) -> None:
        """Mark fields as deliberately not modelled (e.g. multi-token-prediction modules)."""
        self.used.update(keys)

    def _lookup(self, keys: tuple[str, ...], default: Any) -> tuple[str, Any]:
        self.used.update(keys)
        for key in keys:
            if self.cfg.get(key) is not None:
                return key, self.cfg[key]
        if default is MISSING:
            raise self.error(f"field {keys[0]!r} is missing" + (f" (also tried {', '.join(keys[1:])})"
                                                               if len(keys) > 1 else ""))
        return keys[0], default

    def int(self, *keys: str, default: Any = MISSING, minimum: int = 1) -> int:
        """The first present key among ``keys`` as an int >= ``minimum``."""
        key, value = self._lookup(keys, default)
        return self._int(key, value, minimum)

    def _int(self, key: str, value: Any, minimum: int) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.error(f"field {key!r} must be {kind}, got {short(value)}")
        return value

    def same_int(self, *keys: str, default: Any = MISSING, minimum: int = 1) -> int:
        """Like :meth:`int`, but every present key must hold the same value (conflicting fields fail)."""
        values = {k: self._int(k, self.cfg[k], minimum) for k in keys if self.cfg.get(k) is not None}
        if len(set(values.values())) > 1:
            raise self.error("conflicting fields " + ", ".join(f"{k}={v}" for k, v in values.items()))
        return self.int(*keys, default=default, minimum=minimum)

    def int_list(self, key: str, default: tuple[int, ...] = ()) -> tuple[int, ...]:
        _, value = self._lookup((key,), default)
        if not isinstance(value, list | tuple):
            raise self.error(f"field {key!r} must be a list of integers, got {short(value)}")
        return tuple(self._int(key, v, 0) for v in value)

    def str_list(self, key: str) -> tuple[str, ...] | None:
        _, value = self._lookup((key,), None)
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise self.error(f"field {key!r} must be a list of strings, got {short(value)}")
        return tuple(value)

    def flag(self, key: str, default: bool) -> bool:
        _, value = self._lookup((key,), default)
        if not isinstance(value, bool):
            raise self.error(f"field {key!r} must be true or false, got {short(value)}")
        return value

    def number(self, key: str, default: float) -> float:
        _, value = self._lookup((key,), default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.error(f"field {key!r} must be a non-negative number, got {short(value)}")
        return float(value)

    def head_dim(self, hidden: int, heads: int, heads_key: str) -> int:
        if self.has("head_dim"):
            return self.int("head_dim")
        if hidden % heads:
            raise self.error(f"field {heads_key!r}={heads} does not divide hidden size {hidden}")
        return hidden // heads

    def unread_structural(self) -> list[str]:
        """Structural fields with a value that no reader consumed."""
        return sorted(k for k, v in self.cfg.items()
                      if _STRUCTURAL.search(k) and k not in self.used and k not in _TRAINING_ONLY
                      and not k.startswith("_") and v not in (None, False, 0, "", [], {}))


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _common(r: Reader) -> dict[str, Any]:
    return {"published_params": r.number("_published_params", 0.0),
            "max_position_embeddings": r.int("max_position_embeddings", "n_positions", default=0, minimum=0)}


_FULL, _WINDOWED = ("full_attention",), ("sliding_attention", "chunked_attention")


def windowed_layers(r: Reader, layers: int, default: list[bool]) -> list[int]:
    """Layers whose attention is windowed (sliding or chunked), from ``layer_types`` else ``default``."""
    kinds = r.str_list("layer_types")
    if kinds is None:
        return [i for i, w in enumerate(default) if w]
    if len(kinds) != layers:
        raise r.error(f"field 'layer_types' has {len(kinds)} entries for num_hidden_layers={layers}")
    unknown = sorted(set(kinds) - set(_FULL) - set(_WINDOWED))
    if unknown:
        raise r.error(f"field 'layer_types' has {', '.join(map(repr, unknown))} layers, "
                      "which the cost model does not express (only full, sliding and chunked attention)")
    return [i for i, kind in enumerate(kinds) if kind in _WINDOWED]


def window(r: Reader, num_layers: int, layers: list[int] | range) -> dict[str, Any]:
    """``sliding_window`` over ``layers`` unless ``layer_types`` says which layers are windowed (none
    when the window is null or covers no layer)."""
    size = r.int("sliding_window", default=0, minimum=0)
    default = set(layers)
    layers = windowed_layers(r, num_layers, [i in default for i in range(num_layers)])
    return {"sliding_window": size, "window_layers": tuple(layers)} if size and layers else {}


def qwen_attention(r: Reader, layers: int) -> dict[str, Any]:
    """Qwen2: q/k/v biases; Qwen3: per-head q/k RMSNorm; both: optional window on the top layers."""
    out: dict[str, Any] = {}
    if r.cfg.get("model_type", "").startswith("qwen2"):
        out.update(qkv_bias=True, attention_bias=False)
    else:
        out["qk_norm"] = "head"
    r.ignore("max_window_layers", "sliding_window")
    first = layers  # HF: with use_sliding_window, layers >= max_window_layers use the window
    if r.flag("use_sliding_window", False):
        first = r.int("max_window_layers", default=layers, minimum=0)
    out.update(window(r, layers, range(first, layers)))
    return out


