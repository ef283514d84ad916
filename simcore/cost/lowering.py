"""Lowering: a strategy becomes the tasks one GPU runs for one microbatch, with their costs.

This is the one place where operators, layouts and collectives meet the cost formulas
(:mod:`simcore.hardware.kernels` for compute, :mod:`simcore.collectives` for communication). Everything is
vectorized over strategies: each :class:`Task` holds one value per strategy, so the proxy can
price 10^5 strategies in one call and the scalar path is the same code with one strategy. The
simulator executes the same task lists, so the proxy equals the simulator with contention and
overlap switched off.

The tasks of one microbatch come in blocks (see :func:`lower`): ``dense_layer`` and ``moe_layer``
(one decoder layer of each kind), ``first`` (embedding, on the first stage), ``last`` (final
conversion, LM head and sampling, on the last stage) and ``p2p`` (the activation sent to the next
pipeline stage).

What it takes and gives (:class:`StrategyArrays`, :class:`CostContext`, :class:`Task`) lives in
:mod:`simcore.cost.tasks` and is re-exported here.

A hybrid model (Gated DeltaNet linear attention on some layers, :mod:`simcore.models.linear_attention`) has
one block per layer kind as any other; its token-mixer tasks (``qkv``, ``attention``, ``out_proj``) are
the mean layer: the softmax-attention version's time weighted by the share of attention layers plus the
linear-attention version's weighted by theirs, so a stage of ``n`` layers costs ``n`` mean layers (exact
for the whole model, and for every stage holding its share of attention layers).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from simcore.collectives import collective_time_s
from simcore.cost.cluster import group_ranks_per_domain
from simcore.cost.host import kernel_fixed_s
from simcore.cost.tasks import CostContext, StrategyArrays, Task
from simcore.hardware.kernels import attention_time_s, gemm_bytes, gemm_time_s, memory_time_s
from simcore.models import ModelSpec
from simcore.models import linear_attention as gdn
from simcore.models import sparse_attention as dsa
from simcore.moe import fp8_token_bytes, mode_for_phase, uniform_time_s
from simcore.strategy import layout as L
from simcore.strategy.opgraph import REPLICATED, input_layout, model_ops, output_layout
from simcore.xp import SCALAR

__all__ = ["StrategyArrays", "Task", "CostContext", "lower", "attention_dims", "routed_experts", "expert_gemm_s"]


def routed_experts(routed, experts, xp=np):
    """``(p_active, per_expert)``: the share of ``experts`` experts that receive at least one of ``routed``
    token copies routed uniformly at random, and the copies each of those gets (expected counts)."""
    p_active = 1.0 - (1.0 - 1.0 / experts) ** routed
    return p_active, routed / experts / xp.maximum(p_active, 1e-30)


def expert_gemm_s(m, n, k, active, gpu, precision: str, weight_bytes=None, flops_per_s=None, xp=np,
                  bytes_per_s=None):
    """One grouped expert GEMM over ``active`` experts of ``m`` tokens each: a dense GEMM's time
    (:func:`~simcore.hardware.kernels.gemm_time_s`), or, where a serving runtime's own MoE kernel has its own
    rates, at least its useful work at its tensor-core rate ``flops_per_s`` and at least its HBM bytes
    (:func:`~simcore.hardware.kernels.gemm_bytes`: the active experts' weights at decode sizes) at its
    bandwidth ``bytes_per_s``."""
    time = gemm_time_s(m, n, k, gpu, precision, count=active, weight_bytes=weight_bytes)
    if flops_per_s is not None:
        time = xp.maximum(time, 2.0 * m * n * k * active / flops_per_s + gpu.kernel_overhead_s)
    if bytes_per_s is not None:
        nbytes = gemm_bytes(m, n, k, precision, count=active, weight_bytes=weight_bytes)
        time = xp.maximum(time, nbytes / bytes_per_s + gpu.kernel_overhead_s)
    return time


def attention_dims(model: ModelSpec, phase: str) -> tuple[int, int]:
    """Per-head (score, value) widths of the attention core. MLA decodes with absorbed weights over
    its compressed latent (DeepSeek-V3 inference); prefill uses the full per-head dims."""
    if model.is_mla:
        if phase == "decode":
            return model.kv_lora_rank + model.qk_rope_head_dim, model.kv_lora_rank
        return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    return model.head_dim, model.head_dim


@functools.lru_cache(maxsize=65536)
def _scalar_collective_s(name: str, size_bytes: float, n_ranks: int, ranks_per_domain: int, fabric,
                         constants) -> float:
    """One collective's time, memoized: a search prices the same few thousand (collective, size,
    group) combinations over and over, and the vectorized model costs ~0.1 ms per scalar call."""
    kwargs = {} if constants is None else {"constants": constants}
    return float(collective_time_s(name, size_bytes, n_ranks, ranks_per_domain, fabric, **kwargs))


class _Lowerer:
    """Builds the task blocks for one phase; holds the per-strategy values its operators share.

    With one strategy it works on Python numbers (the scalar backend of :mod:`simcore.xp`), with
    many on numpy arrays; the formulas are the same code either way.
    """

    def __init__(self, ctx: CostContext, s: StrategyArrays, phase: str, context_len, expert_load: float = 1.0):
        self.ctx, self.phase = ctx, phase
        self.scalar = len(s) == 1
        load = np.asarray(expert_load, dtype=float)  # one value, or one per strategy
        self.expert_load = float(load.reshape(-1)[0]) if self.scalar or load.ndim == 0 else load
        self.s = _scalar_view(s) if self.scalar else s
        self.xp = SCALAR if self.scalar else np
        self.m, self.w, self.gpu = ctx.model, ctx.workload, ctx.cluster.gpu
        if ctx.workload.cuda_graphs:  # replayed kernels: no launch, only ramp-up and tail (simcore.cost.host)
            self.gpu = self.gpu.with_overrides(kernel_overhead_s=kernel_fixed_s(self.gpu, ctx.workload))
        self.expert_flops_per_s = None  # a serving runtime's own MoE kernel rate (expert_gemm_s), else dense
        self.expert_bytes_per_s = None  # ... and its HBM bandwidth on the experts' weights, else dense
        self.expert_padded_rows = 0  # ... and rows it computes per local expert whatever the routing (FP8)
        self.expert_groups = 1  # a serving pool's moe_ep: each attention group's experts split that many ways whole
        self.ops = model_ops(ctx.model)
        v = self.s
        self.t = float(v.tp) if self.scalar else v.tp.astype(float)
        self.context = float(np.asarray(context_len).reshape(-1)[0]) if self.scalar else np.asarray(context_len, float)
        self.seqs = v.batch / (v.ep * v.microbatches)  # sequences per attention group per microbatch
        self.tokens = self.seqs * (ctx.workload.input_len if phase == "prefill" else 1)
        self.act = ctx.workload.activation_bytes
        self.prefill_chunk: tuple[float, float] | None = None  # (new tokens, cached prior) of a chunk
        domain = ctx.cluster.nvlink_domain_size
        self.rpd = {"tp": group_ranks_per_domain(v.tp, 1, domain),
                    "ep": group_ranks_per_domain(v.ep, v.tp, domain),
                    "pp": self.xp.where(v.pp * v.tp * v.ep <= domain, 2, 1)}
        self.size = {"tp": v.tp, "ep": v.ep, "pp": 2 if self.scalar else np.full(len(s), 2)}

    # ----- compute -------------------------------------------------------------------------
    def _linear(self, name: str, tokens, shape: tuple[int, int] | None = None) -> Task:
        """One GEMM of operator ``name`` under its sharding; ``shape`` overrides its ``[in, out]``."""
        op, c = self.ops[name], self.s.choice[name]
        in_f, out_f = shape or (op.in_features, op.out_features)
        rep = c == REPLICATED
        m = self.xp.where(rep, self.xp.ceil(tokens / self.t), tokens)
        k = self.xp.where(c == 0, in_f / self.t, in_f)
        n = self.xp.where(c == 1, out_f / self.t, out_f)
        time = gemm_time_s(m, n, k, self.gpu, self.w.precision)
        return Task(name, name, "gemm", time, flops=2.0 * m * n * k)

    def _mean_layer(self, attention: Task, linear: list[Task]) -> Task:
        """A hybrid model's token-mixer task: ``attention`` (a softmax-attention layer's) and the sum of
        ``linear`` (a linear-attention layer's) weighted by their layers' shares of the model."""
        m = self.m
        a, b = m.num_attention_layers / m.num_layers, len(m.linear_layers) / m.num_layers
        attention.time_s = a * attention.time_s + b * sum(t.time_s for t in linear)
        attention.flops = a * attention.flops + b * sum(t.flops for t in linear)
        return attention

    def _projection(self, name: str) -> Task:
        """``qkv`` or ``out_proj``; for a hybrid model the mean of the softmax-attention GEMM and the
        Gated DeltaNet one(s): in_proj_qkvz + in_proj_ba, or out_proj from the value heads."""
        m, h = self.m, self.m.hidden_size
        if not m.is_hybrid:
            return self._linear(name, self.tokens)
        o_in, tokens = m.num_heads * m.v_head_dim, self.tokens
        if name == "out_proj":
            value = m.linear_value_heads * m.linear_value_head_dim
            return self._mean_layer(self._linear(name, tokens, (o_in, h)), [self._linear(name, tokens, (value, h))])
        qkv_out = (m.attention_params() - o_in * h) // h
        qkvz, ba = gdn.projection_features(m)
        return self._mean_layer(self._linear(name, tokens, (h, qkv_out)),
                                [self._linear(name, tokens, (h, qkvz)), self._linear(name, tokens, (h, ba))])

    def _experts(self, name: str, tokens) -> Task:
        """Grouped GEMM over this GPU's experts; tokens routed uniformly, idle experts skipped.

        With ``expert_groups`` g > 1 (a serving pool's ``moe_ep``) the ``tp`` GPUs of an attention group
        hold its experts split g ways whole, each share sharded by the operator's choice over ``tp / g``
        GPUs, and run them on the group's replicated tokens: the runtimes' expert parallelism inside a
        tensor-parallel group (:class:`simcore.serving.Pool`). The GPU prices its own slots; under a
        routing config ``expert_load`` is the busiest of the ``ep x g`` expert ranks'."""
        op, c = self.ops[name], self.s.choice[name]
        g = self.expert_groups
        slots = self.xp.ceil((self.m.num_experts + self.s.redundant) / (self.s.ep * g))  # experts and replicas here
        e_total = slots * self.s.ep * g
        # token copies routed to this GPU's experts, scaled by its routing load (1 = uniform)
        routed = tokens * self.s.ep * self.m.top_k * self.expert_load
        p_active, per_expert = routed_experts(routed, e_total, self.xp)
        active = slots * p_active
        t = self.t / g  # the GPUs that shard one expert
        # replicated: the tensor-parallel ranks split the tokens (an expected count, so no ceil)
        m = self.xp.where(c == REPLICATED, per_expert / t, per_expert)
        k = self.xp.where(c == 0, op.in_features / t, op.in_features)
        n = self.xp.where(c == 1, op.out_features / t, op.out_features)
        time = expert_gemm_s(m, n, k, active, self.gpu, self.w.precision, self.w.expert_weight_bytes,
                             self.expert_flops_per_s, self.xp, self.expert_bytes_per_s)
        if self.expert_padded_rows:  # a contiguous-layout kernel computes every expert's padded block
            rows = m * active + slots * self.expert_padded_rows
            time = self.xp.maximum(time, gemm_time_s(rows, n, k, self.gpu, "fp8"))
        return Task(name, name, "gemm", time, flops=2.0 * m * n * k * active)

    def _attention(self) -> Task:
        """The token mixer of one layer: softmax attention, or a hybrid model's mean layer."""
        if not self.m.is_hybrid:
            return self._softmax_attention()
        return self._mean_layer(self._softmax_attention(), [self._linear_mixer()])

    def _linear_mixer(self) -> Task:
        """One Gated DeltaNet layer's conv1d, delta rule and gated norm
        (:func:`simcore.models.linear_attention.mixer_time_s`): heads split under ``dim1``, sequences under
        ``dim0``, as attention's."""
        seqs_local, head_div = self._linear_split()
        new, prior = self.prefill_chunk or (float(self.w.input_len), 0.0)
        time, flops = gdn.mixer_time_s(self.m, self.gpu, self.w.precision, self.xp, self.phase, seqs_local,
                                       new, prior, head_div, self.act)
        return Task("linear_attention", "attention", "attention", time, flops=flops)

    def _linear_split(self):
        """(sequences on one GPU, head divisor) of a linear-attention layer: sequences split under
        ``dim0``, heads under ``dim1``."""
        c = self.s.choice["attention"]
        return self.xp.where(c == 0, self.xp.ceil(self.seqs / self.t), self.seqs), self.xp.where(c == 1, self.t, 1.0)

    def linear_chain_s(self, new: float):
        """The exposed serial state pass of a prefill of ``new`` tokens per sequence in the linear mixer
        above (:func:`simcore.models.linear_attention.chain_s`), part of its time."""
        seqs_local, head_div = self._linear_split()
        return gdn.chain_s(self.m, self.gpu, self.xp, seqs_local, new, head_div, self.act)

    def _softmax_attention(self) -> Task:
        c = self.s.choice["attention"]
        heads = self.m.num_heads
        d_qk, d_v = attention_dims(self.m, self.phase)
        kv_layer = self.m.kv_cache_elements_per_token() / self.m.num_attention_layers * self.w.kv_bytes
        kv_heads_shard = 1.0 if self.m.is_mla else self.xp.minimum(self.t, self.m.num_kv_heads)
        if self.phase == "decode":  # sliding-window layers attend to at most their window
            span = self.m.attended_context(self.context)
            flops_seq = 2.0 * span * heads * (d_qk + d_v)
            # KV passes: 1 when a KV head is loaded once for its group of query heads; a per-query-head
            # kernel re-reads it for each further head of the local group (workload.decode_kv_reread).
            group = 1.0 if self.m.is_mla else heads / self.m.num_kv_heads * self.xp.where(
                c == 1, kv_heads_shard / self.t, 1.0)
            passes = 1.0 + self.xp.maximum(group - 1.0, 0.0) * self.w.decode_kv_reread
            bytes_seq = span * kv_layer * passes + heads * (d_qk + d_v) * self.act
        else:  # a whole prompt, or a chunk of new tokens after `prior` cached ones (chunked prefill)
            new, prior = self.prefill_chunk or (float(self.w.input_len), 0.0)
            pairs = self.m.prefill_attention_pairs(prior + new) - (self.m.prefill_attention_pairs(prior) if prior else 0.0)
            flops_seq = 2.0 * pairs * heads * (d_qk + d_v)
            bytes_seq = (prior + new) * kv_layer + new * 2.0 * heads * (d_qk + d_v) * self.act
        seqs_local = self.xp.where(c == 0, self.xp.ceil(self.seqs / self.t), self.seqs)
        flops = flops_seq * seqs_local / self.xp.where(c == 1, self.t, 1.0)
        if self.phase != "decode" and dsa.sparse_prefill(self.m, new, prior):  # FlashMLA's sparse kernel
            heads_gpu = dsa.padded_heads(heads / self.xp.where(c == 1, self.t, 1.0), self.gpu, self.xp)
            d_qk, d_v = attention_dims(self.m, "decode")  # absorbed MLA over the latent, as decode
            flops = 2.0 * new * self.m.index_topk * heads_gpu * (d_qk + d_v) * seqs_local
        kv_div = self.xp.where(c == 1, kv_heads_shard, 1.0)
        nbytes = bytes_seq * seqs_local / kv_div
        time = attention_time_s(flops, nbytes, self.gpu, self.w.precision, decode=self.phase == "decode")
        if self.m.is_sparse_attention:  # the lightning indexer, unsplit on every TP rank (simcore.models.sparse_attention)
            new, prior = self.prefill_chunk or (float(self.w.input_len), 0.0)
            index_s, index_flops = dsa.indexer_time_s(self.m, self.gpu, self.xp, self.phase, seqs_local, self.context,
                                                      new, prior)
            tokens = seqs_local * (1.0 if self.phase == "decode" else new)
            scored = self.phase == "decode" or dsa.sparse_prefill(self.m, new, prior)
            for k, n in dsa.projection_shapes(self.m, scored):
                index_s = index_s + gemm_time_s(tokens, n, k, self.gpu, self.w.precision)
                index_flops = index_flops + 2.0 * tokens * n * k
            time, flops = time + index_s, flops + index_flops
        return Task("attention", "attention", "attention", time, flops=flops)

    def _norms(self, lay) -> Task:
        """Two RMSNorms and two residual adds per layer: memory-bound element-wise kernels."""
        local = self.xp.where((lay == L.S_TOK) | (lay == L.S_FEAT), self.tokens / self.t, self.tokens)
        nbytes = local * self.m.hidden_size * self.act * 3.0
        return Task("norms", "norms", "memory", memory_time_s(nbytes, self.gpu), count=2)

    # ----- communication -------------------------------------------------------------------
    def _coll(self, name: str, op: str, group: str, coll, size) -> Task:
        """A collective of code ``coll`` (one per strategy; NONE costs nothing) on ``group``."""
        if self.scalar:
            code = int(coll)
            time = 0.0
            if code != L.NONE:  # one memoized call (see _scalar_collective_s)
                time = _scalar_collective_s(L.COLLECTIVE_NAMES[code], float(size), int(self.size[group]),
                                            int(self.rpd[group]), self.ctx.cluster.fabric,
                                            self.ctx.collective_constants)
            return Task(name, op, "comm", time, group=group, size_bytes=float(size) if code else 0.0,
                        extra={"collective": code})
        time = np.zeros(len(self.s))
        if not coll.any():
            return Task(name, op, "comm", time, group=group, size_bytes=time, extra={"collective": coll})
        for code in np.unique(coll).tolist():
            if code == L.NONE:
                continue
            rows = coll == code
            time[rows] = collective_time_s(L.COLLECTIVE_NAMES[code], size[rows], self.size[group][rows],
                                           self.rpd[group][rows], self.ctx.cluster.fabric, **self._constants())
        return Task(name, op, "comm", time, group=group, size_bytes=np.where(coll == L.NONE, 0.0, size),
                    extra={"collective": coll})

    def _constants(self) -> dict:
        c = self.ctx.collective_constants
        return {} if c is None else {"constants": c}

    def _convert(self, name: str, op: str, src, dst, features: float, tokens=None) -> Task:
        tokens = self.tokens if tokens is None else tokens
        full = tokens * features * self.act
        if self.scalar:
            coll, size = L.transition(int(src), int(dst), float(full), int(self.s.tp))
        else:
            coll, size = L.transition_arrays(src, dst, full, self.s.tp)
        return self._coll(name, op, "tp", coll, size)

    def _hold(self, lay):
        """Fraction of a TP-group tensor one rank holds in a layout (1 for R and P)."""
        return self.xp.where((lay == L.S_TOK) | (lay == L.S_FEAT), 1.0 / self.t, 1.0)

    def _layout(self, op: str, side: str):
        f = input_layout if side == "in" else output_layout
        return f(op, self.s.choice[op])

    # ----- blocks --------------------------------------------------------------------------
    def attention_block(self, res_in) -> tuple[list[Task], str]:
        """qkv -> attention -> out_proj; returns tasks and the operator whose input comes next."""
        h, ops = self.m.hidden_size, self.ops
        tasks = [self._norms(res_in), self._projection("qkv")]
        if self.m.qk_norm == "layer":
            tasks.append(self._qk_norm_all_reduce())
        tasks.append(self._convert("qkv->attention", "attention", self._layout("qkv", "out"),
                                   self._layout("attention", "in"), ops["qkv"].out_features))
        tasks.append(self._attention())
        tasks.append(self._convert("attention->out_proj", "out_proj", self._layout("attention", "out"),
                                   self._layout("out_proj", "in"), ops["attention"].out_features))
        tasks.append(self._projection("out_proj"))
        nxt = "router" if "router" in ops and self._moe else "dense_ffn1"
        tasks.append(self._convert(f"out_proj->{nxt}", "out_proj", self._layout("out_proj", "out"),
                                   self._layout(nxt, "in"), h))
        tasks.append(self._convert("residual->mlp", "out_proj", res_in, self._layout(nxt, "in"), h))
        return tasks, nxt

    def _qk_norm_all_reduce(self) -> Task:
        """A full-width q/k RMSNorm (MiniMax-M2's ``qk_norm="layer"``) over heads split across the TP
        ranks needs each token's sum of squares from every rank: one all-reduce of two FP32 values per
        token (q's and k's) after the QKV projection (vLLM's and SGLang's ``MiniMaxText01RMSNormTP``:
        ``forward_qk`` concatenates the two variances and all-reduces them once). Nothing when QKV's
        output is not split by features or TP is 1."""
        split = (self._layout("qkv", "out") == L.S_FEAT) & (self.s.tp > 1)
        coll = self.xp.where(split, L.ALL_REDUCE, L.NONE)
        return self._coll("qk_norm", "qkv", "tp", coll, self.xp.where(split, self.tokens * 2.0 * 4.0, 0.0))

    def dense_mlp(self, res_in) -> list[Task]:
        h, f = self.m.hidden_size, self.m.ffn_size
        nxt = self._layout("qkv", "in")
        return [
            self._linear("dense_ffn1", self.tokens),
            self._convert("dense_ffn1->dense_ffn2", "dense_ffn2", self._layout("dense_ffn1", "out"),
                          self._layout("dense_ffn2", "in"), f),
            self._linear("dense_ffn2", self.tokens),
            self._convert("dense_ffn2->next", "dense_ffn2", self._layout("dense_ffn2", "out"), nxt, h),
            self._convert("residual->next", "dense_ffn2", res_in, nxt, h),
        ]

    def moe_mlp(self, res_in) -> list[Task]:
        """Router, shared experts, dispatch, routed experts, combine; outputs summed in one layout."""
        h, k = self.m.hidden_size, self.m.top_k
        nxt = self._layout("qkv", "in")
        tasks = [self._linear("router", self.tokens)]
        e1_in, e2_out = self._layout("expert_ffn1", "in"), self._layout("expert_ffn2", "out")
        if "shared_ffn1" in self.ops:
            f_s = self.m.expert_ffn_size * self.m.num_shared_experts
            tasks += [
                self._convert("mlp->shared_ffn1", "shared_ffn1", res_in, self._layout("shared_ffn1", "in"), h),
                self._linear("shared_ffn1", self.tokens),
                self._convert("shared_ffn1->shared_ffn2", "shared_ffn2", self._layout("shared_ffn1", "out"),
                              self._layout("shared_ffn2", "in"), f_s),
                self._linear("shared_ffn2", self.tokens),
            ]
            shared_out = self._layout("shared_ffn2", "out")
            # Shared and routed outputs in the same layout are summed locally, then converted once.
            separate = shared_out != e2_out
            t = self._convert("shared_ffn2->next", "shared_ffn2", shared_out, nxt, h)
            t.time_s = self.xp.where(separate, t.time_s, 0.0)
            t.size_bytes = self.xp.where(separate, t.size_bytes, 0.0)
            t.extra["collective"] = self.xp.where(separate, t.extra["collective"], L.NONE)
            tasks.append(t)
            for task in tasks[1:]:
                task.branch = "shared"
        routed = self.tokens * k  # token copies each attention group sends (and, uniformly, receives)
        received = routed * self.expert_load  # what the busiest GPU receives under skewed routing
        tasks.append(self._convert("mlp->expert_ffn1", "expert_ffn1", res_in, e1_in, h))
        # dispatch carries the expert GEMMs' input precision (FP8 under fp8, as DeepEP does); combine
        # returns BF16 outputs
        dispatch_bytes = min(self.act, self.w.weight_bytes)
        tasks.append(self._a2a("dispatch", "expert_ffn1", received * h * dispatch_bytes * self._hold(e1_in)))
        tasks.append(self._experts("expert_ffn1", self.tokens))
        tasks.append(self._convert("expert_ffn1->expert_ffn2", "expert_ffn2", self._layout("expert_ffn1", "out"),
                                   self._layout("expert_ffn2", "in"), self.m.expert_ffn_size, tokens=received))
        tasks.append(self._experts("expert_ffn2", self.tokens))
        tasks.append(self._a2a("combine", "expert_ffn2", received * h * self.act * self._hold(e2_out)))
        tasks.append(self._convert("expert_ffn2->next", "expert_ffn2", e2_out, nxt, h))
        tasks.append(self._convert("residual->next", "expert_ffn2", res_in, nxt, h))
        return tasks

    def _a2a(self, name: str, op: str, size) -> Task:
        coll = self.xp.where(self.s.ep > 1, L.ALL_TO_ALL, L.NONE)
        routing = self.ctx.routing
        if routing is None or routing.a2a != "deepep":
            return self._coll(name, op, "ep", coll, size)

        h, mode = self.m.hidden_size, mode_for_phase(self.phase)
        fp8 = name == "dispatch" and min(self.act, self.w.weight_bytes) == 1.0
        # bytes of one token copy on this GPU (size is the hot GPU's received copies x that)
        token_bytes = size / self.xp.maximum(self.tokens * self.m.top_k * self.expert_load, 1e-30)
        token_bytes = token_bytes * (fp8_token_bytes(h) / h if fp8 else 1.0)  # FP8 with its scales
        time = uniform_time_s(mode, self.tokens, self.m.top_k, token_bytes, self.s.ep, self.rpd["ep"],
                              self.gpu, self.expert_load)
        time = self.xp.where(self.s.ep > 1, time, 0.0)
        time = float(time) if self.scalar else np.asarray(time, dtype=float)
        return Task(name, op, "comm", time, group="ep", size_bytes=self.xp.where(coll == L.NONE, 0.0, size),
                    extra={"collective": coll, "algorithm": f"deepep_{mode}"})

    def layer(self, moe: bool) -> list[Task]:
        self._moe = moe
        res_in = self._layout("qkv", "in")
        tasks, nxt = self.attention_block(res_in)
        mlp_in = self._layout(nxt, "in")
        return tasks + (self.moe_mlp(mlp_in) if moe else self.dense_mlp(mlp_in))

    def first(self) -> list[Task]:
        """Embedding lookup (memory bound) and its conversion to the first layer's input."""
        c = self.s.choice["embedding"]
        h = self.m.hidden_size
        rows = self.xp.where(c == 1, self.tokens, self.tokens / self.t)  # vocab- or token-split lookups
        width = self.xp.where(c == 1, h / self.t, h)
        out_rows = self.xp.where(c == 0, self.tokens, rows)
        nbytes = rows * width * self.w.weight_bytes + out_rows * width * self.act
        emb = Task("embedding", "embedding", "memory", memory_time_s(nbytes, self.gpu))
        conv = self._convert("embedding->qkv", "embedding", self._layout("embedding", "out"),
                             self._layout("qkv", "in"), h)
        return [emb, conv]

    def last(self) -> list[Task]:
        """Final norm, LM head, and gathering what sampling needs (top value and id per rank)."""
        h, vocab = self.m.hidden_size, self.m.vocab_size
        seq_tokens = self.seqs  # only the last position of each sequence is sampled
        conv = self._convert("final->lm_head", "lm_head", self._layout("qkv", "in"),
                             self._layout("lm_head", "in"), h)
        head = self._linear("lm_head", seq_tokens)
        out = self._layout("lm_head", "out")
        # vocab-sharded logits: all-gather (value, id) = 8 bytes per token and rank; partial logits:
        # all-reduce of the logits; token-sharded: all-gather of the sampled ids (4 bytes).
        coll = self.xp.select([out == L.S_FEAT, out == L.P, out == L.S_TOK],
                         [L.ALL_GATHER, L.ALL_REDUCE, L.ALL_GATHER], L.NONE)
        coll = self.xp.where(self.s.tp > 1, coll, L.NONE)
        size = self.xp.select([out == L.S_FEAT, out == L.P], [seq_tokens * 8.0 * self.t, seq_tokens * vocab * self.act],
                         seq_tokens * 4.0)
        sample = self._coll("sample", "lm_head", "tp", coll, size)
        # the host's time per step is not a task of a microbatch: simcore.cost.host charges it once per step
        return [conv, head, sample]

    def p2p(self) -> list[Task]:
        """Activation sent to the next pipeline stage (each TP rank sends what it holds)."""
        size = self.tokens * self.m.hidden_size * self.act * self._hold(self._layout("qkv", "in"))
        coll = self.xp.where(self.s.pp > 1, L.SEND_RECV, L.NONE)
        return [self._coll("send_recv", "pipeline", "pp", coll, size)]


def _scalar_view(s: StrategyArrays) -> SimpleNamespace:
    """One strategy's degrees and choices as Python ints (for the scalar backend)."""
    return SimpleNamespace(tp=int(s.tp[0]), ep=int(s.ep[0]), pp=int(s.pp[0]), dp=int(s.dp[0]),
                           batch=int(s.batch[0]), microbatches=int(s.microbatches[0]),
                           choice={op: int(c[0]) for op, c in s.choice.items()}, redundant=int(s.redundant[0]))


def _as_arrays(blocks: dict[str, list[Task]]) -> None:
    """Scalar results back to one-element arrays, so callers see one shape whatever the backend."""
    for tasks in blocks.values():
        for task in tasks:
            task.time_s = np.array([float(task.time_s)])
            task.size_bytes = np.array([float(task.size_bytes)])
            task.flops = np.array([float(task.flops)])
            if "collective" in task.extra:
                task.extra["collective"] = np.array([int(task.extra["collective"])])


def lower(ctx: CostContext, s: StrategyArrays, phase: str, context_len=None,
          expert_load: float = 1.0) -> dict[str, list[Task]]:
    """Task blocks of one microbatch for ``phase`` (``prefill`` | ``decode``) at ``context_len``.

    ``context_len`` (decode only; scalar or one per strategy) defaults to the workload's input length.
    ``expert_load`` (scalar or one per strategy) scales the routed tokens the critical GPU receives
    (its share of the routing times ``ep``): 1 for uniform routing; the proxy passes the expected
    busiest rank's load under ``ctx.routing`` (:func:`simcore.moe.expected_max_load`), the simulator
    the busiest rank's load of its draw.
    """
    if phase not in ("prefill", "decode"):
        raise ValueError(f"lower: phase must be prefill or decode, got {phase!r}")
    context = ctx.workload.input_len if context_len is None else context_len
    low = _Lowerer(ctx, s, phase, context, expert_load)
    blocks = {"first": low.first(), "last": low.last(), "p2p": low.p2p()}
    if ctx.model.num_dense_layers > 0:
        blocks["dense_layer"] = low.layer(moe=False)
    if ctx.model.num_moe_layers > 0:
        blocks["moe_layer"] = low.layer(moe=True)
    if low.scalar:
        _as_arrays(blocks)
    return blocks
