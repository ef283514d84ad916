"""The GPU time of one scheduler step: a mixed batch of prefill chunks and decodes, priced by the lowering.

A continuous-batching step runs one forward pass over every token the scheduler picked: the chunks of
prompts being prefilled and one token of each decoding sequence. Everything but attention depends only
on how many tokens pass through the GEMMs and how many sequences sample a token, so those tasks come
from the one lowering (:mod:`simcore.cost.lowering`, the proxy's and the simulator's) and are memoized on
``(tokens, sampled)``; attention depends on each sequence's context and is priced per step with the
same attention task of the lowering, per prompt chunk and for the decodes. The memo is exact (a test compares it
with a fresh lowering of the same batch): nothing is interpolated.

With data-parallel attention (``ep`` attention groups, as SGLang's DP attention and DeepSeek's
deployments run) all groups step together through the MoE layers, so a step costs what its busiest
group costs.

Routing skew: with a routing config on the context (``ctx.routing``) and experts split over ``ep``
groups (times the pool's ``moe_ep`` inside each tensor-parallel group), each MoE layer is priced at the expected load of its busiest expert rank for the step's token
copies (:func:`simcore.moe.expected_max_loads`, the proxy's own expectation, with the strategy's
redundant experts): a step waits for its busiest GPU. Without one, routing is uniform (load 1). A
runtime whose ``moe_a2a_backend`` is ``deepep`` prices dispatch and combine with DeepEP's kernels.

A hybrid model's token mixer is priced per layer kind: each stage's softmax-attention layers with the
attention kernel (which grows with each context), its linear-attention layers with the Gated DeltaNet
mixer (:mod:`simcore.models.linear_attention`: per sequence and chunk, whatever the context).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from simcore.collectives.constants import DEFAULT
from simcore.cost.lowering import CostContext, StrategyArrays, Task, _Lowerer
from simcore.cost.memory import stage_layers
from simcore.models.linear_attention import MIXER_KERNELS
from simcore.models.sparse_attention import INDEXER_KERNELS
from simcore.moe import RoutingConfig, expected_max_loads
from simcore.moe.deepep import kernel_sms
from simcore.serving.plan import check_expert_layout
from simcore.serving.requests import ServingInputError
from simcore.strategy import layout as L
from simcore.strategy.sharding import Strategy

__all__ = ["GroupBatch", "StepCost", "custom_all_reduce_time_s", "batch_halves", "step_is_decode", "two_batch_overlap_s"]


def custom_all_reduce_time_s(n: int, size_bytes: float, gpu, one_shot_s: float, two_shot_s: float) -> float:
    """A runtime's own all-reduce of ``size_bytes`` over ``n`` GPUs of one NVLink domain: the faster of
    one-shot (``one_shot_s`` plus ``(n - 1)`` buffers read over NVLink) and two-shot (``two_shot_s`` plus
    ``2 (n - 1) / n`` of the buffer moved), at NVLink's bandwidth and the collectives' NVLink efficiency.
    The one pricing :meth:`StepCost.custom_all_reduce_s` uses and ``python -m validation.studies.collectives.fit_custom_allreduce``
    fits its two latencies with."""
    bw = gpu.nvlink_bandwidth_bytes_per_s * DEFAULT.nvlink_efficiency
    return min(one_shot_s + (n - 1) * size_bytes / bw, two_shot_s + 2.0 * (n - 1) / n * size_bytes / bw)


def two_batch_overlap_s(compute_s: float, exchange_s: float, moe_layers: int) -> float:
    """A stage's time under two-batch overlap (SGLang's ``--enable-two-batch-overlap``, DeepSeek's
    prefill and decode deployments): the step's batch runs as two micro-batches, each one's expert
    dispatch and combine hidden behind the other's compute, so the stage takes the longer of its
    compute and its exchanges plus one MoE layer's share of the shorter (the pipeline's fill and drain).
    ``compute_s`` is what the two micro-batches compute (:meth:`StepCost.overlap_parts`: each priced at
    its own half of the batch, so weights are read twice and GEMMs run at half the rows).

    >>> two_batch_overlap_s(10.0, 4.0, 2)
    12.0
    """
    if exchange_s <= 0:
        return compute_s
    return max(compute_s, exchange_s) + min(compute_s, exchange_s) / max(moe_layers, 1)


def batch_halves(g: GroupBatch) -> tuple[GroupBatch, GroupBatch]:
    """The two micro-batches two-batch overlap splits ``g`` into: each prompt chunk split by its tokens
    (the second half attends to the first), the decoding sequences split in two with their share of the
    contexts, the sampled tokens likewise (the first half takes the odd one of each)."""
    a_seqs = -(-g.decode_seqs // 2)
    b_seqs = g.decode_seqs - a_seqs
    a_ctx = g.decode_context_sum * a_seqs / g.decode_seqs if g.decode_seqs else 0.0
    firsts = [-(-n // 2) for n, _ in g.chunks]
    a = GroupBatch([(f, p) for f, (_, p) in zip(firsts, g.chunks, strict=True)], a_seqs, a_ctx,
                   -(-g.sampled // 2), g.decode_q)
    b = GroupBatch([(n - f, p + f) for f, (n, p) in zip(firsts, g.chunks, strict=True) if n - f > 0], b_seqs,
                   g.decode_context_sum - a_ctx, g.sampled // 2, g.decode_q)
    return a, b


def step_is_decode(groups) -> bool:
    """Whether a step is pure decode (no group extends a prompt): DeepEP's low-latency kernels then."""
    return not any(g.chunks for g in groups)


@dataclass
class GroupBatch:
    """What one attention group runs in a step.

    ``chunks``: ``(new_tokens, prior_context)`` of each prompt chunk; ``decode_seqs`` decoding
    sequences whose contexts (tokens each attends to, its new one included) sum to
    ``decode_context_sum``; ``sampled``: tokens sampled this step (one per decode and per prompt whose
    last chunk this is; with speculative decoding each decode samples its ``decode_q``). Attention is
    linear in each context, so the sum is all it needs. ``decode_q``: tokens each decoding sequence runs
    through the model (1, or 1 + its drafts under speculative decoding, :mod:`.speculative`).
    """

    chunks: list[tuple[int, int]]
    decode_seqs: int
    decode_context_sum: float
    sampled: int
    decode_q: int = 1

    @classmethod
    def of(cls, chunks: list[tuple[int, int]], decode_contexts: list[int], sampled: int,
           decode_q: int = 1) -> GroupBatch:
        return cls(chunks, len(decode_contexts), float(sum(decode_contexts)), sampled, decode_q)

    @property
    def tokens(self) -> int:
        return sum(c for c, _ in self.chunks) + self.decode_seqs * self.decode_q

    @property
    def sequences(self) -> int:
        """Sequences in the step (what a CUDA graph captured by batch size is keyed on)."""
        return len(self.chunks) + self.decode_seqs


class _NoAttention(_Lowerer):
    """The lowering with the attention kernel left out (priced per step by :class:`StepCost`), its
    expert exchanges priced for ``a2a_phase`` (DeepEP's kernels: :func:`simcore.moe.mode_for_phase`)."""

    a2a_phase = "prefill"

    def _attention(self) -> Task:
        return Task("attention", "attention", "attention", 0.0)

    def _a2a(self, name: str, op: str, size) -> Task:
        phase, self.phase = self.phase, self.a2a_phase
        try:
            return super()._a2a(name, op, size)
        finally:
            self.phase = phase


def _linear_per_stage(model, pp: int) -> list[int]:
    """Linear-attention layers of each pipeline stage (contiguous split, the first ``L mod pp`` stages
    one layer longer, as :func:`simcore.cost.memory.stage_layers`)."""
    base, extra = divmod(model.num_layers, pp)
    out, start = [], 0
    for p in range(pp):
        n = base + (p < extra)
        out.append(sum(model.layer_is_linear(i) for i in range(start, start + n)))
        start += n
    return out


class StepCost:
    """Per-stage GPU time of a step on one worker running ``strategy`` (``dp`` is ignored: one replica)
    with its experts split ``moe_ep`` ways whole inside each tensor-parallel group (:class:`.Pool`).

    ``stage_times(groups)`` returns one time per pipeline stage, in seconds, for the given per-group
    batches (one :class:`GroupBatch` per attention group, at most ``strategy.ep``).
    """

    def __init__(self, ctx: CostContext, strategy: Strategy, runtime=None, moe_ep: int = 1):
        check_expert_layout(strategy, moe_ep, ctx.model)
        if moe_ep > 1 and runtime is not None and runtime.moe_a2a_backend == "deepep":
            raise ServingInputError(f"pool.moe_ep: runtime {runtime.name} dispatches tokens with DeepEP, whose "
                                    f"all-to-all inside a tensor-parallel group is not modelled; split the "
                                    f"experts over attention-DP groups (ep) instead")
        self.moe_ep = moe_ep
        if runtime is not None and runtime.two_batch_overlap and runtime.scheduler != "sglang":
            raise ServingInputError(f"serving.two_batch_overlap: SGLang's --enable-two-batch-overlap; runtime "
                                    f"{runtime.name} ({runtime.scheduler}) has none")
        if runtime is not None and runtime.moe_a2a_backend == "deepep" and getattr(ctx.routing, "a2a", None) != "deepep":
            ctx = dataclasses.replace(ctx, routing=dataclasses.replace(ctx.routing or RoutingConfig(), a2a="deepep"))
        self.ctx, self.strategy, self.runtime = ctx, strategy, runtime
        self.model, self.gpu, self.w = ctx.model, ctx.cluster.gpu, ctx.workload
        dense, moe, _ = stage_layers(self.model, np.array([strategy.pp]))
        self.dense_layers, self.moe_layers = dense[0].tolist(), moe[0].tolist()
        self.linear_layers = _linear_per_stage(self.model, strategy.pp)
        self._memo: dict[tuple[int, int], dict[str, tuple[float, int, int]]] = {}
        self._stage_memo: dict[tuple[int, int], tuple[tuple[float, ...], int, tuple[int, ...]]] = {}
        self.lowerings = 0  # how many times the lowering actually ran (the memo's misses)
        one = StrategyArrays.from_strategies([strategy.replace(dp=1, batch=strategy.ep, microbatches=1)])
        self._arrays = one
        self._attn = _Lowerer(ctx, one, "decode", ctx.workload.input_len)

    # ------------------------------------------------------------------ everything but attention
    def expert_load(self, tokens: int) -> float:
        """The busiest expert rank's expected load over the mean when each of the ``ep`` groups runs
        ``tokens`` tokens, its experts on ``ep x moe_ep`` ranks (1.0: no routing config, a dense model,
        or one expert rank; module doc)."""
        m, s = self.model, self.strategy
        ranks = s.ep * self.moe_ep
        if self.ctx.routing is None or not m.is_moe or ranks <= 1:
            return 1.0
        copies = float(max(tokens, 1)) * s.ep * m.top_k
        return float(expected_max_loads(self.ctx.routing, m.num_experts, ranks, copies, s.redundant_experts))

    def block_tasks(self, tokens: int, sampled: int, decode: bool = False) -> dict[str, list[Task]]:
        """The lowering's tasks of each block (``first``, ``last``, ``p2p``, ``dense_layer``,
        ``moe_layer``) at ``tokens`` tokens and ``sampled`` sampled ones, attention left out (not
        memoized: :meth:`_blocks` keeps their totals; :mod:`.breakdown` reads them task by task).
        ``decode``: a pure-decode step, whose DeepEP exchanges run the low-latency kernels (SGLang's
        ``--deepep-mode auto``: low latency for decode batches, normal kernels for batches that extend
        a prompt; :func:`step_is_decode`)."""
        low = _NoAttention(self.ctx, self._arrays, "prefill", self.w.input_len, self.expert_load(tokens))
        low.a2a_phase = "decode" if decode else "prefill"
        low.tokens, low.seqs = float(max(tokens, 1)), float(max(sampled, 1))
        low.expert_groups = self.moe_ep
        if self.runtime is not None:  # the runtime's own grouped expert kernels (RuntimeProfile.moe_gemm_efficiency)
            low.expert_flops_per_s = self.runtime.expert_flops_per_s(low.gpu, self.w.precision)
            low.expert_bytes_per_s = self.runtime.expert_bytes_per_s(low.gpu)
            if self.w.precision == "fp8":  # the padded layout is DeepGEMM's, an FP8 kernel's
                low.expert_padded_rows = self.runtime.moe_padded_rows
        blocks = {"first": low.first(), "last": low.last(), "p2p": low.p2p()}
        if self.model.num_dense_layers:
            blocks["dense_layer"] = low.layer(moe=False)
        if self.model.num_moe_layers:
            blocks["moe_layer"] = low.layer(moe=True)
        return blocks

    def _blocks(self, tokens: int, sampled: int, decode: bool = False) -> dict[str, tuple[float, int, int, dict]]:
        """Each block of the lowering at ``tokens`` tokens and ``sampled`` sampled ones: its GPU seconds,
        its kernels, its compute kernels, and its communication seconds by group (``tp``, ``ep``,
        ``pp``; memoized on the two counts and the step's kind)."""
        key = (tokens, sampled, decode)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        self.lowerings += 1
        blocks = self.block_tasks(tokens, sampled, decode)

        def total(tasks):  # the per-pass host task is the runtime profile's business here
            return sum(self.task_s(t) * t.count for t in tasks if t.kind != "host")

        def kernels(tasks, compute_only=False):
            return sum(t.count for t in tasks if t.kind != "host" and float(t.time_s) > 0
                       and not (compute_only and t.is_comm))

        def comm(tasks):
            out: dict[str, float] = {}
            for t in tasks:
                if t.is_comm and t.kind != "host":
                    out[t.group] = out.get(t.group, 0.0) + self.task_s(t) * t.count
            return out

        out = {name: (total(b), kernels(b), kernels(b, True), comm(b)) for name, b in blocks.items()}
        self._memo[key] = out
        return out

    def _lowered(self, tokens: int, sampled: int, decode: bool = False):
        """Per-stage GPU seconds of everything but attention, the kernels launched, the compute kernels
        of each stage, and each stage's communication seconds by group (memoized: a pure function of
        the two counts and the step's kind, asked once per step)."""
        key = (tokens, sampled, decode)
        hit = self._stage_memo.get(key)
        if hit is None:
            hit = self._stage_memo[key] = self._lower_stages(tokens, sampled, decode)
        return hit

    def _lower_stages(self, tokens: int, sampled: int, decode: bool):
        s, b, none = self.strategy, self._blocks(tokens, sampled, decode), (0.0, 0, 0, {})
        moe_s = self.runtime.moe_layer_s if self.runtime is not None else 0.0
        times, launches, compute, comms = [], 0, [], []
        for p in range(s.pp):
            layers = [(self.dense_layers[p], b.get("dense_layer", none)), (self.moe_layers[p], b.get("moe_layer", none))]
            edge = [(1, b["first"])] if p == 0 else []
            edge.append((1, b["last"] if p == s.pp - 1 else b["p2p"]))
            counted = layers + edge
            times.append(sum(n * blk[0] for n, blk in counted) + self.moe_layers[p] * moe_s)
            launches += sum(n * blk[1] for n, blk in counted)
            compute.append(sum(n * blk[2] for n, blk in counted))
            comm: dict[str, float] = {}
            for n, blk in counted:
                for group, t in blk[3].items():
                    comm[group] = comm.get(group, 0.0) + n * t
            comms.append(comm)
        return tuple(times), launches, tuple(compute), tuple(comms)

    def draft(self, groups: list[GroupBatch]) -> tuple[float, int]:
        """GPU seconds and kernels of a step's speculative draft passes (:mod:`.speculative`): the
        runtime's ``spec_tokens`` passes, each one layer of the model (an MoE layer where it has them,
        with the runtime's fixed MoE time) over the busiest group's decoding sequences, that layer's
        attention at their mean context, and the output head. (0, 0) without speculation or decodes."""
        k = self.runtime.spec_tokens if self.runtime is not None else 0
        busy = [g for g in groups if g.decode_seqs]
        if not k or not busy:
            return 0.0, 0
        g = max(busy, key=lambda g: g.decode_seqs)
        b = self._blocks(g.decode_seqs, g.decode_seqs, True)
        moe = "moe_layer" in b
        layer, last = b["moe_layer" if moe else "dense_layer"], b["last"]
        attn = self.attention_s(GroupBatch([], g.decode_seqs, g.decode_context_sum, g.decode_seqs))
        per_pass = layer[0] + last[0] + attn + (self.runtime.moe_layer_s if moe else 0.0)
        return k * per_pass, k * (layer[1] + last[1] + 1)

    def task_s(self, task: Task) -> float:
        """A task's time; a small tensor-parallel all-reduce inside one NVLink domain runs on the
        runtime's own kernel when that is faster than NCCL's (see :meth:`custom_all_reduce_s`)."""
        nccl = float(task.time_s)
        if (self.runtime is None or task.group != "tp" or int(task.extra.get("collective", 0)) != L.ALL_REDUCE
                or self.strategy.tp > self.ctx.cluster.nvlink_domain_size):
            return nccl
        size = float(task.size_bytes)
        if size > self.runtime.custom_ar_max_bytes:
            return nccl
        return min(nccl, self.custom_all_reduce_s(size))

    def custom_all_reduce_s(self, size_bytes: float) -> float:
        """The serving runtimes' all-reduce for small messages inside an NVLink domain (vLLM's and
        SGLang's ``custom_all_reduce`` and symmetric-memory all-reduce, TensorRT-LLM's one-shot/two-shot
        ``AllReduce``): one-shot, each GPU reads its ``n - 1`` peers' buffers over NVLink after one barrier
        (fixed latency ``runtime.custom_ar_s``); two-shot (or NVLink-SHARP multimem), a reduce-scatter
        then an all-gather, each moving ``(n - 1) / n`` of the buffer, behind a barrier each
        (``runtime.two_shot_ar_s``); whichever is faster (:func:`custom_all_reduce_time_s`)."""
        return custom_all_reduce_time_s(self.strategy.tp, size_bytes, self.gpu, self.runtime.custom_ar_s,
                                        self.runtime.two_shot_ar_s)

    # ------------------------------------------------------------------ attention
    def attention_s(self, group: GroupBatch) -> float:
        """One softmax-attention layer's attention for one group: the lowering's attention kernel, once
        per prompt chunk (``new`` tokens after ``prior`` cached ones) and once for the decodes at their
        mean context (exact where attention is linear in context, i.e. up to sliding windows)."""
        return self._mixer_s(group, self._attn._softmax_attention)

    def linear_attention_s(self, group: GroupBatch) -> float:
        """One linear-attention layer's token mixer for one group (0 without linear attention): the
        prompt chunks and the decodes, independent of their contexts. The runtimes run all of a step's
        chunks as one variable-length batch (fla's ``cu_seqlens``), so its kernels' fixed costs count
        once per step, not once per chunk, and the chunks' serial state passes run side by side: the
        longest one's chain counts (:meth:`simcore.cost.lowering._Lowerer.linear_chain_s`)."""
        if not self.model.is_hybrid:
            return 0.0
        low = self._attn
        batched = max(len(group.chunks) - 1, 0) * MIXER_KERNELS["prefill"] * low.gpu.kernel_overhead_s
        low.seqs = 1.0
        chains = [float(low.linear_chain_s(float(new))) for new, _ in group.chunks]
        return self._mixer_s(group, low._linear_mixer) - batched - (sum(chains) - max(chains, default=0.0))

    def _mixer_s(self, group: GroupBatch, kernel) -> float:
        low = self._attn
        time = 0.0
        for new, prior in group.chunks:
            low.phase, low.seqs, low.prefill_chunk = "prefill", 1.0, (float(new), float(prior))
            time += float(kernel().time_s)
        if group.decode_seqs:
            low.phase, low.seqs, low.prefill_chunk = "decode", float(group.decode_seqs), None
            low.context = group.decode_context_sum / group.decode_seqs
            time += float(kernel().time_s)
        return time

    # ------------------------------------------------------------------ a step
    def stage_times(self, groups: list[GroupBatch]) -> tuple[list[float], int, int, list[int]]:
        """Per-stage GPU seconds of the step, the kernels it launches, its busiest group's tokens, and
        the compute kernels of each stage (each priced with ``GpuSpec.kernel_overhead_s``)."""
        busy = [g for g in groups if g.tokens > 0]
        if not busy:
            return [0.0] * self.strategy.pp, 0, 0, [0] * self.strategy.pp
        tokens = max(g.tokens for g in busy)
        sampled = max(g.sampled for g in busy)
        base, launches, compute, _ = self._lowered(tokens, sampled, step_is_decode(busy))
        per_layer = max(len(g.chunks) + (1 if g.decode_seqs else 0) for g in busy)
        if self.model.is_sparse_attention:  # each attention call is preceded by its indexer's kernels
            per_layer *= 1 + INDEXER_KERNELS
        per_linear = max(MIXER_KERNELS["prefill"] * bool(g.chunks) + MIXER_KERNELS["decode"] * bool(g.decode_seqs)
                         for g in busy) if self.model.is_hybrid else 0
        times, kernels = [], []
        for b, (attn, lin), d, e, n_lin in zip(base, self.stage_mixers(busy), self.dense_layers, self.moe_layers,
                                               self.linear_layers, strict=True):
            times.append(b + (attn + lin))
            kernels.append((d + e - n_lin) * per_layer + n_lin * per_linear)
        compute = [c + k for c, k in zip(compute, kernels, strict=True)]
        draft_s, draft_kernels = self.draft(busy)  # speculative drafts run after the step's last stage
        times[-1] += draft_s
        compute[-1] += draft_kernels
        return times, launches + sum(kernels) + draft_kernels, tokens, compute

    def stage_mixers(self, busy: list[GroupBatch]) -> list[tuple[float, float]]:
        """Each stage's token-mixer seconds, ``(softmax attention, linear attention)``, of the group whose
        mixers take longest there (all groups step together, so the slowest one counts)."""
        mixers = [(self.attention_s(g), self.linear_attention_s(g)) for g in busy]
        out = []
        for d, e, n_lin in zip(self.dense_layers, self.moe_layers, self.linear_layers, strict=True):
            n_attn = d + e - n_lin
            a, lin = max(mixers, key=lambda m: n_attn * m[0] + n_lin * m[1])
            out.append((n_attn * a, n_lin * lin))
        return out

    @staticmethod
    def replays_graph(groups: list[GroupBatch], tokens: int, runtime) -> bool:
        """Whether the step (its busiest group running ``tokens`` tokens) replays a CUDA graph: vLLM
        captures graphs by the step's tokens; SGLang and TensorRT-LLM by its sequences (batch size), which
        differ only under speculative decoding (each sequence runs 1 + drafts tokens)."""
        key = tokens if runtime.scheduler == "vllm" else max((g.sequences for g in groups), default=0)
        return runtime.uses_graph(key, any(g.chunks for g in groups))

    def step_key(self, groups: list[GroupBatch]) -> tuple[int, int, bool] | None:
        """``(tokens, sampled, decode)`` of the busiest group, what the lowering's memo is keyed on
        (``None`` for a step that runs no tokens)."""
        busy = [g for g in groups if g.tokens > 0]
        if not busy:
            return None
        return max(g.tokens for g in busy), max(g.sampled for g in busy), step_is_decode(busy)

    def stage_comm(self, groups: list[GroupBatch]) -> list[dict[str, float]]:
        """Each stage's closed-form communication seconds by group (``tp``, ``ep``, ``pp``): the part of
        :meth:`stage_times` that the lowering's collectives and exchanges take."""
        key = self.step_key(groups)
        if key is None:
            return [{} for _ in range(self.strategy.pp)]
        return [dict(c) for c in self._lowered(*key)[3]]

    def gpu_times(self, groups: list[GroupBatch], runtime) -> list[float]:
        """Per-stage GPU seconds of the step under ``runtime`` (:meth:`gpu_parts`), each stage's expert
        exchanges overlapped with its compute where the runtime runs two-batch overlap
        (:func:`two_batch_overlap_s` over :meth:`overlap_parts`)."""
        if not runtime.two_batch_overlap:
            return self.gpu_parts(groups, runtime)
        return [two_batch_overlap_s(c, e, n)
                for (c, e), n in zip(self.overlap_parts(groups, runtime), self.moe_layers, strict=True)]

    def overlap_parts(self, groups: list[GroupBatch], runtime) -> list[tuple[float, float]]:
        """Each stage's ``(compute, exchanges)`` seconds under two-batch overlap: the step split into two
        micro-batches (SGLang's TBO splits an extend batch by tokens, a decode batch by sequences), each
        priced by the lowering at its own half (:func:`batch_halves`), so a memory-bound decode reads its
        experts' weights twice and its GEMMs run at half the rows; the exchanges are the two micro-batches'
        dispatches and combines. While an exchange of DeepEP's normal kernels runs it holds
        ``normal_sms`` of the GPU's SMs (:func:`simcore.moe.deepep.kernel_sms`), so the compute it hides
        behind runs on the rest (low-latency kernels receive through RDMA hooks and hold none)."""
        halves = [batch_halves(g) for g in groups]
        parts = [(self.gpu_parts(h, runtime), self.stage_comm(h)) for h in ([a for a, _ in halves], [b for _, b in halves])]
        mode = "low_latency" if step_is_decode([g for g in groups if g.tokens > 0]) else "normal"
        held = kernel_sms(mode) if self.runtime is not None and self.runtime.moe_a2a_backend == "deepep" else 0
        slow = self.gpu.num_sms / max(self.gpu.num_sms - held, 1)
        out = []
        for p in range(self.strategy.pp):
            exchange = sum(c[p].get("ep", 0.0) for _, c in parts)
            compute = sum(t[p] - c[p].get("ep", 0.0) for t, c in parts)
            compute += min(compute, exchange) * (slow - 1.0)  # the overlapped part runs on fewer SMs
            out.append((compute, exchange))
        return out

    def gpu_parts(self, groups: list[GroupBatch], runtime) -> list[float]:
        """Per-stage GPU seconds of the step under ``runtime`` (a :class:`RuntimeProfile`), every
        operation in turn (no two-batch overlap).

        Replaying a CUDA graph, each compute kernel costs ``runtime.graph_kernel_s`` of fixed time
        instead of an isolated kernel's ``GpuSpec.kernel_overhead_s``; outside one, the GPU waits for the
        host to launch each kernel, so a step takes at least its launches times ``runtime.launch_s`` plus
        ``runtime.eager_moe_layer_s`` per MoE layer (the framework ops an eager MoE layer dispatches)."""
        times, launches, tokens, compute = self.stage_times(groups)
        if self.replays_graph(groups, tokens, runtime):
            saved = self.gpu.kernel_overhead_s - runtime.graph_kernel_s
            return [t - n * saved for t, n in zip(times, compute, strict=True)]
        floor = launches * runtime.launch_s + sum(self.moe_layers) * runtime.eager_moe_layer_s
        total = sum(times)
        if 0 < total < floor:
            return [t * floor / total for t in times]
        return times
