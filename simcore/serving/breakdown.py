"""Where a serving step's time goes: its GPU time split by what runs, beside the host's time per step.

:func:`step_breakdown` prices one step exactly as the simulator does (:meth:`StepCost.gpu_times`; a
test holds the two equal) and splits it into parts a profiler trace of the runtime would show:

- ``attention``: the softmax-attention kernels over each sequence's context (and a sparse-attention
  model's indexer); ``linear attention``: a hybrid model's Gated DeltaNet mixers;
- ``GEMMs``: the dense projections (QKV, output, dense MLP, router, shared experts, LM head);
- ``routed experts``: the grouped expert GEMMs of the MoE layers, and ``MoE fixed time (fitted)``: the
  runtime's fixed time per MoE layer (``RuntimeProfile.moe_layer_s``), a number fitted on the fit rows'
  TPOT that stands for what the MoE block takes beyond its priced kernels (routing, sorting, the grouped
  kernels' grids over every expert): time the model does not explain kernel by kernel, labelled so;
- ``communication``: tensor-parallel all-reduces and gathers, expert dispatch / combine, pipeline sends;
- ``other kernels``: norms, embeddings and the rest of the memory-bound kernels;
- ``speculative drafts``: the draft passes of speculative decoding;
- ``CUDA graph replay`` (negative): what replaying a graph saves on each compute kernel's fixed time
  (``GpuSpec.kernel_overhead_s`` down to ``RuntimeProfile.graph_kernel_s``), or ``eager launch floor``:
  what an eager step waits on the host's kernel launches beyond the kernels' own time.

Each part sums over the pipeline stages (a step's path through the worker). ``host_s`` is the step's
host time (:func:`~simcore.serving.worker.step_host_s`); with an overlapping runtime consecutive steps
start ``max(gpu, host)`` apart, else ``gpu + host``: ``bound`` says which one sets the pace.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcore.serving.runtime import RuntimeProfile
from simcore.serving.step_cost import GroupBatch, StepCost, step_is_decode

__all__ = ["PARTS", "StepBreakdown", "step_breakdown", "mean_decode_batches"]

PARTS = ("attention", "linear attention", "GEMMs", "routed experts", "MoE fixed time (fitted)", "communication",
         "other kernels", "speculative drafts", "CUDA graph replay", "eager launch floor")


@dataclass(frozen=True)
class StepBreakdown:
    """One step: ``parts`` (seconds, by :data:`PARTS`, zeros left out) summing to ``gpu_s``; the host's
    ``host_s``; ``step_s`` between consecutive such steps; ``bound`` ``gpu`` or ``host``."""

    sequences: int
    tokens: int
    parts: dict[str, float]
    gpu_s: float
    host_s: float
    step_s: float
    bound: str

    def to_ms_dict(self) -> dict:
        return {"sequences": self.sequences, "tokens": self.tokens, "bound": self.bound,
                "gpu_ms": self.gpu_s * 1e3, "host_ms": self.host_s * 1e3, "step_ms": self.step_s * 1e3,
                "parts_ms": {k: v * 1e3 for k, v in self.parts.items()}}


def _part(task) -> str:
    if task.is_comm:
        return "communication"
    if task.name.startswith("expert_ffn"):
        return "routed experts"
    return "GEMMs" if task.kind == "gemm" else "other kernels"


def step_breakdown(cost: StepCost, groups: list[GroupBatch], runtime: RuntimeProfile) -> StepBreakdown:
    """The step of ``groups`` (one :class:`GroupBatch` per attention group) on ``cost``'s worker under
    ``runtime``, split as the module docstring says."""
    busy = [g for g in groups if g.tokens > 0]
    if not busy:
        raise ValueError("step_breakdown: the step runs no tokens")
    tokens, sampled = max(g.tokens for g in busy), max(g.sampled for g in busy)
    blocks = cost.block_tasks(tokens, sampled, step_is_decode(busy))
    parts = dict.fromkeys(PARTS, 0.0)
    pp = cost.strategy.pp
    for p in range(pp):
        counted = [(cost.dense_layers[p], blocks.get("dense_layer", [])), (cost.moe_layers[p], blocks.get("moe_layer", []))]
        counted += [(1, blocks["first"])] if p == 0 else []
        counted.append((1, blocks["last"] if p == pp - 1 else blocks["p2p"]))
        for n, tasks in counted:
            for t in tasks:
                if t.kind != "host":  # the per-pass host task is the runtime profile's business (StepCost)
                    parts[_part(t)] += n * t.count * cost.task_s(t)
        parts["MoE fixed time (fitted)"] += cost.moe_layers[p] * runtime.moe_layer_s
    for attn, lin in cost.stage_mixers(busy):
        parts["attention"] += attn
        parts["linear attention"] += lin
    parts["speculative drafts"] = cost.draft(busy)[0]
    gpu = sum(cost.gpu_times(groups, runtime))
    adjust = gpu - sum(parts.values())
    parts["CUDA graph replay" if cost.replays_graph(groups, tokens, runtime) else "eager launch floor"] = adjust
    host = runtime.host_s(max(g.sequences for g in groups))
    step = max(gpu, host) if runtime.overlap_host else gpu + host
    bound = "host" if runtime.overlap_host and host > gpu else "gpu"
    return StepBreakdown(max(g.sequences for g in busy), tokens, {k: v for k, v in parts.items() if v},
                         gpu, host, step, bound)


def mean_decode_batches(stats: dict, groups: int, decode_q: int = 1) -> list[GroupBatch]:
    """The run's mean pure-decode step of one pool (its :func:`~simcore.serving.simulate.pool_stats`):
    each of its ``groups`` attention groups running the busiest group's mean sequences (rounded, at least
    one) at the mean context. Empty if the pool took no pure-decode step."""
    if not stats.get("decode_steps"):
        return []
    seqs = max(round(stats["mean_decode_seqs"]), 1)
    context = stats["mean_decode_context"] * seqs
    return [GroupBatch([], seqs, context, seqs * decode_q, decode_q) for _ in range(groups)]
