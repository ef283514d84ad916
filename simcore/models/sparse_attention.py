"""DeepSeek sparse attention (DSA) of DeepSeek-V3.2 and GLM-5: the lightning indexer and top-k selection.

Each softmax-attention layer of a DSA model is MLA whose queries attend to at most ``index_topk``
cached tokens, the ones a small "lightning indexer" scores highest (DeepSeek-AI, "DeepSeek-V3.2:
Pushing the Frontier of Open Large Language Models", arXiv 2512.02556, sec. 2.1; the reference
``Indexer`` of ``deepseek-ai/DeepSeek-V3.2-Exp``'s ``inference/model.py``; transformers'
``GlmMoeDsaIndexer``). Per layer and token the indexer has

- ``wq_b`` ``[q_lora_rank, H_i d_i]`` (its queries come from MLA's compressed query), ``wk`` ``[h, d_i]``
  with a LayerNorm over ``d_i`` (weight and bias), and ``weights_proj`` ``[h, H_i]`` (a weight per
  index head): ``H_i = index_n_heads``, ``d_i = index_head_dim``;
- one index key of ``d_i`` per cached token, stored in FP8 with one 4-byte scale per 128 elements
  whatever the KV cache's type (:func:`key_bytes`);
- the scores ``I(t, s) = sum_j w_j relu(q_j(t) . k(s))`` of every query ``t`` against every cached
  ``s <= t`` in FP8 (``fp8_mqa_logits`` / ``fp8_paged_mqa_logits`` of DeepGEMM), FP32 logits written
  and read back by the top-k selection: :data:`INDEXER_KERNELS` kernels per layer.

So the indexer's work grows with the whole context (quadratic in a prompt), the attention core's only
up to ``index_topk`` per query (:func:`attended`, :func:`prefill_pairs`), and the cache holds every
token (the latent plus its index key). The indexer is replicated on every tensor-parallel rank: its
queries have ``H_i`` heads of their own and the serving runtimes run it unsplit (vLLM's and SGLang's
``Indexer`` build ``wq_b`` / ``wk`` / ``weights_proj`` as ``ReplicatedLinear``), so :func:`indexer_time_s`
charges each GPU the indexer of all its sequences, and its projections (:func:`projection_shapes`) are
held and run whole on every rank: counted in the attention's parameters (:func:`indexer_params`) but not
in the split ``qkv`` operator (:func:`simcore.strategy.opgraph.model_ops`); the memory model adds them unsplit.

How the serving runtimes run it on Hopper (SGLang's ``nsa`` backend, v0.5.8-0.5.9: ``nsa_backend.py``,
``nsa/nsa_indexer.py``; read from the released wheels):

- decode: the indexer scores the whole context at every step (``fp8_paged_mqa_logits``, then top-k),
  and the attention reads the selected latents (FA3 over the top-k page table, the absorbed MLA form);
- prefill of sequences no longer than ``index_topk``: ordinary causal MLA (FA3, the MHA form), the
  indexer only storing the new tokens' keys (``skip_logits_computation``): no scores, no top-k;
- prefill of longer sequences (:func:`sparse_prefill`): the indexer scores every new query against the
  whole context (``fp8_mqa_logits``), and FlashMLA's sparse kernel (``flash_mla_sparse_fwd``) attends in
  the absorbed form over ``index_topk`` selected keys for every query, its query heads padded to a
  tile of 64 on Hopper, 128 on Blackwell (``required_padding``; :func:`padded_heads`): at TP 8, GLM-5's
  8 heads per GPU run as 64. The kernel walks all ``index_topk`` slots of a query (unselected slots of
  an early query are masked, not skipped: read from its fixed ``[queries, topk]`` index shape, not
  timed here).

Sizes are elements, times seconds.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["INDEXER_KERNELS", "check", "indexer_params", "projection_shapes", "key_bytes", "attended",
           "prefill_pairs", "sparse_prefill", "padded_heads", "indexer_time_s"]

#: Kernels of one layer's indexer per prompt chunk or decode batch (SGLang's ``Indexer.forward``): its
#: three GEMMs (``wq_b``, ``wk``, ``weights_proj``: :func:`projection_shapes`), the key's LayerNorm, rope
#: on the index query and key, FP8 quantisation of the query and of the key with its store into the
#: cache, the logits, the top-k.
INDEXER_KERNELS = 9
_GEMMS = 3
#: ... where nothing is scored (a sequence within the top-k): ``wk``, the LayerNorm, rope, quantise-and-store.
_KEY_ONLY_KERNELS = 4
_SCALE_BLOCK = 128  # elements per FP32 scale of the FP8 index keys
_LOGIT_BYTES = 4.0  # FP32 logits, written by the scoring kernel and read by the top-k


def check(m, fail) -> None:
    """Validate the DSA fields of a ModelSpec; ``fail(field, requirement)`` raises."""
    fields = ("index_topk", "index_n_heads", "index_head_dim")
    given = [f for f in fields if getattr(m, f)]
    if not given:
        return
    for field in fields:
        if getattr(m, field) <= 0:
            fail(field, f"must be positive with {', '.join(given)} set (DeepSeek sparse attention)")
    if not m.kv_lora_rank:
        fail("index_topk", "needs MLA attention (kv_lora_rank > 0): DeepSeek sparse attention selects MLA latents")
    if m.window_layers or m.linear_layers:
        fail("index_topk", "with windowed or linear-attention layers is not expressible")


def projection_shapes(m, scored: bool = True) -> list[tuple[int, int]]:
    """``[in, out]`` of the indexer's GEMMs run for a token: ``wq_b``, ``wk``, ``weights_proj``; only ``wk``
    where nothing is scored (:func:`sparse_prefill`); none without DSA."""
    if not m.index_topk:
        return []
    wk = (m.hidden_size, m.index_head_dim)
    if not scored:
        return [wk]
    return [(m.q_lora_rank or m.hidden_size, m.index_n_heads * m.index_head_dim), wk,
            (m.hidden_size, m.index_n_heads)]


def indexer_params(m) -> int:
    """One layer's indexer (elements): ``wq_b``, ``wk``, its LayerNorm, ``weights_proj``; 0 without DSA."""
    if not m.index_topk:
        return 0
    return sum(k * n for k, n in projection_shapes(m)) + 2 * m.index_head_dim


def key_bytes(m) -> float:
    """Bytes of one token's index key in one layer: FP8 elements plus their FP32 scales (0 without DSA)."""
    if not m.index_topk:
        return 0.0
    return float(m.index_head_dim) + 4.0 * math.ceil(m.index_head_dim / _SCALE_BLOCK)


def attended(m, context, xp=None):
    """Cached tokens one decode query attends to at ``context``: at most ``index_topk``."""
    if not m.index_topk:
        return context
    return (xp or np).minimum(context, float(m.index_topk))


def prefill_pairs(m, seq_len: float) -> float:
    """Causal (query, key) pairs of a prefill of ``seq_len`` tokens whose queries keep ``index_topk`` keys."""
    w = float(m.index_topk)
    if seq_len <= w:
        return seq_len * seq_len / 2.0
    return w * seq_len - w * w / 2.0


def sparse_prefill(m, new: float, prior: float) -> bool:
    """Whether a prompt chunk of ``new`` tokens after ``prior`` cached ones takes the sparse path: a DSA
    model whose sequence is longer than ``index_topk`` (module doc)."""
    return bool(m.index_topk) and prior + new > m.index_topk


def padded_heads(heads, gpu, xp=None):
    """Query heads per GPU as FlashMLA's sparse prefill runs them: up to its head tile (module doc)."""
    tile = 128 if gpu.name.startswith(("b200", "gb200", "b300", "gb300")) else 64
    return (xp or np).ceil(heads / tile) * tile


def indexer_time_s(m, gpu, xp, phase: str, seqs, context, new: float, prior: float):
    """(seconds, FLOPs) of one layer's indexer scoring for ``seqs`` sequences on one GPU, its GEMMs
    aside (:func:`projection_shapes`, priced by the caller): in decode one query per sequence over
    ``context`` cached tokens; in prefill ``new`` queries after ``prior`` cached ones (only the new keys
    stored where the sequence fits ``index_topk``: :func:`sparse_prefill`).

    Scores run at the FP8 tensor-core rate (BF16's on a GPU without FP8) at the GPU's attention
    efficiency (a fused kernel like attention's; not timed here: an assumption); the bytes are the
    index keys read, the index queries (FP8) and the FP32 logits written and read back by the top-k."""
    heads, dim = float(m.index_n_heads), float(m.index_head_dim)
    keys = key_bytes(m)
    if phase != "decode" and not sparse_prefill(m, new, prior):  # the new keys stored, nothing scored
        nbytes = seqs * new * keys
        return (nbytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency)
                + (_KEY_ONLY_KERNELS - 1) * gpu.kernel_overhead_s), 0.0 * nbytes
    if phase == "decode":
        pairs, queries, cached = context, 1.0, context
    else:
        pairs = (prior + new) * (prior + new) / 2.0 - prior * prior / 2.0
        queries, cached = new, prior + new
    flops = seqs * 2.0 * pairs * heads * dim
    nbytes = seqs * (cached * keys + queries * heads * dim + 2.0 * _LOGIT_BYTES * pairs)
    peak = gpu.peak_flops_per_s.get("fp8", gpu.peak_flops_per_s["bf16"])
    compute_s = flops / (peak * gpu.attention_efficiency)
    memory_s = nbytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency)
    return xp.maximum(compute_s, memory_s) + (INDEXER_KERNELS - _GEMMS) * gpu.kernel_overhead_s, flops
