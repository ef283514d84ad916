"""Gated DeltaNet, the linear attention of Qwen3-Next and Qwen3.5: parameters, per-sequence state, kernel costs.

Shapes follow Hugging Face transformers' ``Qwen3NextGatedDeltaNet`` (``modeling_qwen3_next.py``; Qwen3.5
splits the same input projection into ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``):
with ``Hk`` key heads of ``dk`` and ``Hv`` value heads of ``dv``,

- ``in_proj_qkvz`` ``[h, 2 Hk dk + 2 Hv dv]`` and ``in_proj_ba`` ``[h, 2 Hv]`` (two GEMMs, as vLLM runs them);
- a depthwise causal conv1d over q|k|v (``conv_dim = 2 Hk dk + Hv dv`` channels, kernel ``K``, no bias);
- ``A_log`` and ``dt_bias`` ``[Hv]``; q and k are repeated to the ``Hv`` value heads, each of which
  keeps a recurrent state ``S`` of ``dk x dv``: ``S_t = a_t S_{t-1} + b_t (v_t - S_{t-1}^T k_t) k_t^T``,
  ``o_t = S_t^T q_t`` (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", arXiv 2412.06464, eq. 10);
- a gated RMSNorm ``[dv]`` (``norm(o) * silu(z)``) and ``out_proj`` ``[Hv dv, h]``.

Per sequence a layer keeps the conv state (``conv_dim x (K - 1)`` at the activation dtype) and the
recurrent state (``Hv x dk x dv`` at ``linear_state_bytes``): fixed bytes, whatever the context
(vLLM ``MambaStateShapeCalculator.gated_delta_net_state_shape``; the recurrent state's dtype is the
config's ``mamba_ssm_dtype``, float32 for Qwen3.5, else the model dtype:
``MambaStateDtypeCalculator.gated_delta_net_state_dtype`` and ``Qwen3_5ForConditionalGenerationConfig``).

The token mixer's cost (:func:`mixer_time_s`): prefill runs flash-linear-attention's chunked forward
(``fla.ops.gated_delta_rule.chunk``: l2norm of q and k, ``chunk_local_cumsum``,
``chunk_scaled_dot_kkt_fwd``, ``solve_tril``, ``recompute_w_u_fwd``, ``chunk_gated_delta_rule_fwd_h``,
``chunk_fwd_o``; 8 kernels) over chunks of :data:`CHUNK` tokens, the chunkwise WY form of arXiv
2412.06464 sec. 3.3; decode is one fused recurrent update per sequence that reads and writes its
state (memory bound). Both are priced by :func:`core_time_s`: the FLOPs at the fused-attention rate of
:func:`simcore.hardware.kernels.attention_time_s`, the bytes at :data:`GDN_HBM_EFFICIENCY` of peak bandwidth, and
the chunked form's serial state pass takes at least :data:`GDN_CHUNK_LATENCY_S` per chunk
(:func:`chain_s`); both constants are fitted on timings of flash-linear-attention's own kernels
(``python -m validation.studies.attention.fit_linear``). The conv1d and the gated norm are memory-bound kernels.
Sizes are elements, times seconds, bytes bytes.
"""

from __future__ import annotations

from simcore.hardware.kernels import attention_time_s, memory_time_s

__all__ = ["CHUNK", "MIXER_KERNELS", "GDN_HBM_EFFICIENCY", "GDN_CHUNK_LATENCY_S", "projection_features",
           "conv_channels", "layer_params", "state_elements", "state_bytes_per_sequence", "check", "chain_s",
           "core_time_s", "mixer_time_s"]

#: Tokens per chunk of the chunked prefill (fla's ``chunk_gated_delta_rule`` uses 64).
CHUNK = 64
#: Kernels of one layer's token mixer: prefill = 8 chunked-rule kernels + conv1d + gated norm;
#: decode = conv1d update + fused recurrent update + gated norm.
MIXER_KERNELS = {"prefill": 10, "decode": 3}
_PREFILL_CORE_KERNELS = 8
#: Share of peak HBM bandwidth flash-linear-attention's delta-rule kernels reach, the recurrent decode
#: update and the chunked prefill alike (its recurrent kernel runs one warp per 8-column slice of a head's
#: state, too little in flight to stream at a copy's rate). Fitted by ``python -m
#: validation.studies.attention.fit_linear`` on this project's H100 timings of fla-core 0.6.0
#: (``validation/data/kernels_h100_gdn_measured.csv``, FP32-state rows; H200 assumed alike).
GDN_HBM_EFFICIENCY = 0.75
#: Least time of one chunk's step in the chunked prefill's state pass (s): ``chunk_gated_delta_rule_fwd_h``
#: walks a sequence's chunks one after another (each step needs the state the last one wrote), so where a
#: step's few bytes (few heads: high tensor parallelism) would stream faster than this, the chain is
#: exposed. Sequences of one call run side by side. Fitted with the share above.
GDN_CHUNK_LATENCY_S = 1.4e-6


def projection_features(m) -> tuple[int, int]:
    """Output widths of the two input projections: (q|k|v|z, b|a)."""
    key, value = m.linear_key_heads * m.linear_key_head_dim, m.linear_value_heads * m.linear_value_head_dim
    return 2 * key + 2 * value, 2 * m.linear_value_heads


def conv_channels(m) -> int:
    """Channels of the depthwise causal conv1d (q, k and v)."""
    return 2 * m.linear_key_heads * m.linear_key_head_dim + m.linear_value_heads * m.linear_value_head_dim


def layer_params(m) -> int:
    """One Gated DeltaNet token mixer (elements): projections, conv1d, A_log, dt_bias, gated norm, out_proj."""
    qkvz, ba = projection_features(m)
    value = m.linear_value_heads * m.linear_value_head_dim
    conv = conv_channels(m) * m.linear_conv_kernel
    return m.hidden_size * (qkvz + ba) + conv + 2 * m.linear_value_heads + m.linear_value_head_dim \
        + value * m.hidden_size


def state_elements(m) -> tuple[int, int]:
    """(conv state, recurrent state) elements one sequence holds in one linear-attention layer."""
    conv = conv_channels(m) * (m.linear_conv_kernel - 1)
    return conv, m.linear_value_heads * m.linear_key_head_dim * m.linear_value_head_dim


def state_bytes_per_sequence(m, activation_bytes: float = 2.0) -> float:
    """Bytes of fixed state one sequence holds over all linear-attention layers (0 without any)."""
    if not m.linear_layers:
        return 0.0
    conv, recurrent = state_elements(m)
    return len(m.linear_layers) * (conv * activation_bytes + recurrent * m.linear_state_bytes)


def check(m, fail) -> None:
    """Validate the linear-attention fields of a ModelSpec; ``fail(field, requirement)`` raises."""
    fields = ("linear_key_heads", "linear_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel", "linear_state_bytes")
    if not m.linear_layers:
        for field in fields:
            if getattr(m, field):
                fail(field, "must be 0 without linear-attention layers (linear_layers empty)")
        return
    for field in fields:
        if getattr(m, field) <= 0:
            fail(field, "must be positive for a model with linear-attention layers")
    if m.linear_value_heads % m.linear_key_heads:
        fail("linear_value_heads", f"must be a multiple of linear_key_heads={m.linear_key_heads} "
             "(q and k are repeated to the value heads)")
    if m.linear_state_bytes not in (2, 4):
        fail("linear_state_bytes", "must be 2 (bf16 / fp16 state) or 4 (fp32 state)")
    if len(m.linear_layers) >= m.num_layers:
        fail("linear_layers", "must leave at least one softmax-attention layer (the KV cache)")
    if set(m.linear_layers) & set(m.window_layers):
        fail("linear_layers", "must not overlap window_layers")
    if m.kv_lora_rank:
        fail("linear_layers", "with MLA attention (kv_lora_rank > 0) is not expressible")


def _core_prefill(m, xp, new, prior, seqs, hk, hv, act):
    """FLOPs and HBM bytes of the chunked rule over ``seqs`` sequences of ``new`` tokens each."""
    c, dk, dv, sb = float(CHUNK), float(m.linear_key_head_dim), float(m.linear_value_head_dim), m.linear_state_bytes
    padded = xp.ceil(new / c) * c * seqs  # the last partial chunk is computed whole
    # per value head and token: K K^T, W = A(bK), Q K^T (6 C dk); U = A(bV), (QK^T) v_new (4 C dv);
    # v_new = U - W S, S += K^T v_new, Q S (6 dk dv); the triangular solve of A (2 C^2 / 3)
    flops = padded * hv * (6.0 * c * dk + 4.0 * c * dv + 6.0 * dk * dv + 2.0 * c * c / 3.0)
    tokens = new * seqs
    # per key head: q and k l2-normalized (read + write each), k read by kkt, w_u, fwd_h and fwd_o,
    # q by fwd_o (9 dk); value heads sharing a key head re-read it from L2
    qk = tokens * hk * 9.0 * dk * act
    # per value head: w written and read (2 dk); v read, u written and read, v_new written and read,
    # o written (6 dv); the C x C block A (fp32 out and in, then act out and in); the state h of each
    # chunk, written by fwd_h and read by fwd_o
    per_value = tokens * hv * (2.0 * dk * act + 6.0 * dv * act + 8.0 * c + 2.0 * c * act
                               + 2.0 * dk * dv * act / c)
    state = seqs * hv * dk * dv * sb * (1.0 + xp.where(prior > 0, 1.0, 0.0))  # final write (+ initial read)
    return flops, qk + per_value + state


def _core_decode(m, seqs, hk, hv, act):
    """FLOPs and HBM bytes of one recurrent update of ``seqs`` sequences: the state read and written."""
    dk, dv, sb = float(m.linear_key_head_dim), float(m.linear_value_head_dim), m.linear_state_bytes
    flops = seqs * hv * 7.0 * dk * dv  # decay, S^T k, rank-1 update, S^T q
    nbytes = seqs * (2.0 * hv * dk * dv * sb + 2.0 * hk * dk * act + 2.0 * hv * dv * act)
    return flops, nbytes


def chain_s(m, gpu, xp, seqs, new, head_div=1.0, act: float = 2.0, hbm_share: float = GDN_HBM_EFFICIENCY,
            chunk_latency_s: float = GDN_CHUNK_LATENCY_S):
    """Exposed time (s) of the chunked prefill's serial state pass over ``seqs`` prompts of ``new`` tokens:
    per chunk, what :data:`GDN_CHUNK_LATENCY_S` leaves once the step's own bytes (every value head's ``w``,
    ``u``, ``k`` and ``v_new`` of the chunk and the state it stores) have streamed."""
    hv = m.linear_value_heads / head_div
    dk, dv = float(m.linear_key_head_dim), float(m.linear_value_head_dim)
    step_bytes = seqs * hv * (CHUNK * (2.0 * dk + 2.0 * dv) + dk * dv) * act
    step_s = step_bytes / (gpu.hbm_bandwidth_bytes_per_s * hbm_share)
    return xp.ceil(new / CHUNK) * xp.maximum(chunk_latency_s - step_s, 0.0)


def core_time_s(m, gpu, precision: str, xp, phase: str, seqs, new=1.0, prior=0.0, head_div=1.0, act: float = 2.0,
                hbm_share: float = GDN_HBM_EFFICIENCY, chunk_latency_s: float = GDN_CHUNK_LATENCY_S):
    """Time (s) and FLOPs of the delta rule's kernels alone (no conv1d, no gated norm) on one GPU: decode,
    one fused recurrent update of ``seqs`` sequences; prefill, the chunked form over ``seqs`` prompts of
    ``new`` tokens each after ``prior`` (its kernels' fixed costs and the serial chain of chunks added).
    ``head_div`` splits the heads over tensor parallelism; ``precision`` is the model's (checked: the
    rule's products run in BF16 whatever the weights). The two constants are the fitted ones unless given
    (the fitting script passes candidates)."""
    hk, hv = m.linear_key_heads / head_div, m.linear_value_heads / head_div
    if phase == "decode":
        flops, nbytes = _core_decode(m, seqs, hk, hv, act)
        extra = 0.0
    else:
        flops, nbytes = _core_prefill(m, xp, new, prior, seqs, hk, hv, act)
        extra = (_PREFILL_CORE_KERNELS - 1) * gpu.kernel_overhead_s + chain_s(m, gpu, xp, seqs, new, head_div, act,
                                                                              hbm_share, chunk_latency_s)
    return attention_time_s(flops, nbytes, gpu, precision, hbm_share=hbm_share) + extra, flops


def mixer_time_s(m, gpu, precision: str, xp, phase: str, seqs, new=1.0, prior=0.0, head_div=1.0,
                 act: float = 2.0):
    """Time (s) and FLOPs of one linear-attention layer's token mixer on one GPU: the delta rule
    (:func:`core_time_s`), the conv1d and the gated norm.

    ``seqs`` sequences on this GPU; prefill: ``new`` tokens each after ``prior`` already in the state;
    decode: one token each. ``head_div`` splits the heads (and conv channels) over tensor parallelism,
    as vLLM shards the key and value heads. Scalars or numpy arrays (one per strategy).
    """
    conv = conv_channels(m) / head_div
    width, k = m.linear_value_head_dim * m.linear_value_heads / head_div, float(m.linear_conv_kernel)
    core, flops = core_time_s(m, gpu, precision, xp, phase, seqs, new, prior, head_div, act)
    if phase == "decode":
        conv_bytes = seqs * conv * act * (2.0 * (k - 1.0) + 2.0)  # state read + write, x in, y out
        tokens = seqs
    else:
        tokens = seqs * new
        conv_bytes = tokens * conv * act * 2.0 + seqs * conv * (k - 1.0) * act * (1.0 + xp.where(prior > 0, 1.0, 0.0))
    norm_bytes = tokens * width * act * 3.0  # read o and z, write the gated output
    return core + memory_time_s(conv_bytes, gpu) + memory_time_s(norm_bytes, gpu), flops
