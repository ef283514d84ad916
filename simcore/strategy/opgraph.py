"""The fused operator graph of a decoder-only model and each operator's sharding options.

A decoder layer is a chain of fused operators (one kernel or grouped kernel each)::

    dense layer:  qkv -> attention -> out_proj -> dense_ffn1 -> dense_ffn2
    MoE layer:    qkv -> attention -> out_proj -> router
                         -> shared_ffn1 -> shared_ffn2          (shared experts, if any)
                         -> dispatch -> expert_ffn1 -> expert_ffn2 -> combine

with ``embedding`` before the first layer and ``lm_head`` after the last. These are the paper's 12
searchable operators. Each one shards over the tensor-parallel group of ``tp`` ranks in one of three
ways (the paper's ``dim 0 | dim 1 | replicated`` of the weight ``[in, out]``):

============  ==========================  ======================  ==============  ==================
choice        linear op (weight [in,out])  attention core          embedding       input -> output
============  ==========================  ======================  ==============  ==================
dim0          row-parallel (split ``in``)  split requests          split vocab     S_FEAT -> P (linear)
dim1          column-parallel (``out``)    split heads             split hidden    R -> S_FEAT
replicated    full weight, split tokens    full, redundant         full table      S_TOK -> S_TOK
============  ==========================  ======================  ==============  ==================

(attention: dim0 is S_TOK -> S_TOK with the KV cache split by request; dim1 is S_FEAT -> S_FEAT with
the KV cache split by KV head; replicated is R -> R with a full KV cache on every rank). ``replicated``
on a linear operator makes the TP group act as data parallel for it, which is how DP-attention is
expressed. Layouts are defined in :mod:`simcore.strategy.layout`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from simcore.models import ModelSpec
from simcore.models import sparse_attention as dsa
from simcore.strategy.layout import S_FEAT, S_TOK, P, R

__all__ = [
    "SEARCHABLE_OPS", "CHOICES", "DIM0", "DIM1", "REPLICATED", "FusedOp", "model_ops",
    "input_layout", "output_layout", "choice_code", "op_applies",
]

SEARCHABLE_OPS = (
    "embedding", "qkv", "attention", "out_proj", "router", "dense_ffn1", "dense_ffn2",
    "shared_ffn1", "shared_ffn2", "expert_ffn1", "expert_ffn2", "lm_head",
)
CHOICES = ("dim0", "dim1", "replicated")
DIM0, DIM1, REPLICATED = 0, 1, 2

# [kind][choice] -> layout. Kinds: 0 linear (incl. lm_head, router), 1 attention, 2 embedding.
_LINEAR, _ATTENTION, _EMBEDDING = 0, 1, 2
_IN = np.array([[S_FEAT, R, S_TOK], [S_TOK, S_FEAT, R], [R, R, R]], dtype=np.int64)
_OUT = np.array([[P, S_FEAT, S_TOK], [S_TOK, S_FEAT, R], [P, S_FEAT, S_TOK]], dtype=np.int64)
_KIND = {"attention": _ATTENTION, "embedding": _EMBEDDING}


@dataclass(frozen=True)
class FusedOp:
    """One fused operator: its weight shape ``[in_features, out_features]`` (per expert for experts).

    ``dims`` names the output tensor's dimensions; ``num_weights`` counts weight matrices of this shape
    in one layer (e.g. the number of routed experts).
    """

    name: str
    in_features: int
    out_features: int
    dims: tuple[str, str]
    num_weights: int = 1

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * self.num_weights


def choice_code(choice: str | int) -> int:
    """Map ``"dim0" | "dim1" | "replicated"`` (or their codes) to the code; errors name the choices."""
    if isinstance(choice, int | np.integer) and 0 <= int(choice) < len(CHOICES):
        return int(choice)
    if choice in CHOICES:
        return CHOICES.index(choice)
    raise ValueError(f"sharding choice {choice!r} is not one of {', '.join(CHOICES)}")


def input_layout(op: str, choice):
    """Layout the operator needs for its input under ``choice`` (works on numpy arrays of codes)."""
    return _IN[_KIND.get(op, _LINEAR), choice]


def output_layout(op: str, choice):
    """Layout of the operator's output under ``choice`` (works on numpy arrays of codes)."""
    return _OUT[_KIND.get(op, _LINEAR), choice]


def op_applies(model: ModelSpec, op: str) -> bool:
    """Whether the model has this operator at all (a dense model has no router or experts)."""
    if op in ("router", "expert_ffn1", "expert_ffn2"):
        return model.is_moe
    if op in ("shared_ffn1", "shared_ffn2"):
        return model.is_moe and model.num_shared_experts > 0
    if op in ("dense_ffn1", "dense_ffn2"):
        return model.num_dense_layers > 0
    return True


@functools.lru_cache(maxsize=64)
def model_ops(model: ModelSpec) -> dict[str, FusedOp]:
    """The model's fused operators (only those it has), keyed by name. Cached: treat as read-only."""
    h = model.hidden_size
    gate = 2 if model.gated_mlp else 1
    o_in = model.num_heads * model.v_head_dim
    qkv_params = model.attention_params() - o_in * h - dsa.indexer_params(model)  # the indexer: replicated
    if model.is_hybrid:  # the mean layer: softmax- and linear-attention weights by their layers' shares
        n_attn, n_lin = model.num_attention_layers, len(model.linear_layers)
        lin_o = model.linear_value_heads * model.linear_value_head_dim
        lin_in = model.linear_attention_params() - lin_o * h
        qkv_params = (n_attn * qkv_params + n_lin * lin_in) // model.num_layers
        o_in = round((n_attn * o_in + n_lin * lin_o) / model.num_layers)
    qkv_out = max(1, qkv_params // h)  # fused q/k/v (MLA: its down+up projections), as one [h, out] GEMM
    ops = [
        FusedOp("embedding", model.vocab_size, h, ("tokens", "hidden")),
        FusedOp("qkv", h, qkv_out, ("tokens", "heads")),
        FusedOp("attention", o_in, o_in, ("tokens", "heads")),
        FusedOp("out_proj", o_in, h, ("tokens", "hidden")),
        FusedOp("lm_head", h, model.vocab_size, ("tokens", "vocab")),
    ]
    if model.num_dense_layers > 0:
        ops += [FusedOp("dense_ffn1", h, gate * model.ffn_size, ("tokens", "ffn")),
                FusedOp("dense_ffn2", model.ffn_size, h, ("tokens", "hidden"))]
    if model.is_moe:
        ops.append(FusedOp("router", h, model.num_experts, ("tokens", "experts")))
        if model.num_shared_experts > 0:
            f_shared = model.expert_ffn_size * model.num_shared_experts
            ops += [FusedOp("shared_ffn1", h, gate * f_shared, ("tokens", "ffn")),
                    FusedOp("shared_ffn2", f_shared, h, ("tokens", "hidden"))]
        ops += [FusedOp("expert_ffn1", h, gate * model.expert_ffn_size, ("tokens", "ffn"), model.num_experts),
                FusedOp("expert_ffn2", model.expert_ffn_size, h, ("tokens", "hidden"), model.num_experts)]
    return {op.name: op for op in ops}
