"""How vLLM, SGLang and Megatron-LM express a strategy: launch flags, and what each one runs per operator.

Our strategy (see :mod:`simcore.strategy.sharding`): a pipeline stage is ``tp * ep`` GPUs in ``ep`` attention
groups of ``tp`` consecutive GPUs (DP-attention); routed experts are split ``ep`` ways across the
groups (the EP group strides by ``tp``) and sharded over each group's ``tp`` GPUs (``dim1``/``dim0``)
or replicated on them; ``dp`` replicas are independent. Each mapper returns a :class:`Mapping` whose
``sharding`` and ``microbatches`` are what the target actually runs, in our vocabulary, so the gaps
between plan and target can be priced by the proxy and the simulator. Differences our model cannot
express (a different group layout) are stated in ``notes`` as not priced.

Flag names assume the versions in :data:`VERSIONS`; check ``--help`` of the version you deploy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simcore.cost.memory import stage_layers
from simcore.models import ModelSpec
from simcore.strategy.sharding import Strategy, megatron_sharding

__all__ = ["Deployment", "Mapping", "VERSIONS", "MAPPERS", "partition"]

VERSIONS = {
    "vllm": "vLLM 0.10-0.11 (V1 engine)",
    "sglang": "SGLang 0.5.x (--moe-dp-size needs a late-2025 or newer release)",
    "megatron": "Megatron-LM / Megatron-Core 0.13+ (MoE parallel folding, static inference engine)",
}

_TP_ATTN = {"qkv": "dim1", "attention": "dim1", "out_proj": "dim0"}
_DP_ATTN = {"qkv": "replicated", "attention": "dim0", "out_proj": "replicated"}
_REPLICATED_EXPERTS = {"expert_ffn1": "replicated", "expert_ffn2": "replicated"}


@dataclass(frozen=True)
class Deployment:
    """What a mapper reads: the plan, the model, where its weights are, the machine, the precision of the
    weights and of the KV cache (``kv_precision``; ``None``: as ``precision``, ``Workload.kv_precision``)."""

    strategy: Strategy
    model: ModelSpec
    model_path: str
    gpus_per_node: int | None = None
    precision: str | None = None
    kv_precision: str | None = None
    #: a serving pool's experts split this many ways whole inside each TP group (:class:`simcore.serving.Pool`)
    moe_ep: int = 1

    @property
    def kv_fp8(self) -> bool:
        """Whether the KV cache the plan was priced with is FP8 (a flag must ask for it: the runtimes'
        ``auto`` keeps a block-FP8 checkpoint's KV in BF16)."""
        return (self.kv_precision or self.precision) == "fp8"


@dataclass
class Mapping:
    """A target's launch line for a plan and what it runs: per-operator sharding, microbatches in
    flight, independent copies to launch, and notes on differences not priced."""

    program: list[str]
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    sharding: dict[str, str] = field(default_factory=megatron_sharding)
    microbatches: int = 1
    microbatches_rule: str = ""
    replicas: int = 1
    notes: list[str] = field(default_factory=list)

    def add(self, *args) -> None:
        self.flags += [str(a) for a in args]


def partition(model: ModelSpec, pp: int) -> list[int]:
    """Layers per pipeline stage as our cost model splits them (first ``L mod pp`` stages get one more)."""
    dense, moe, _ = stage_layers(model, np.array([pp]))
    return [int(d + m) for d, m in zip(dense[0], moe[0], strict=True)][:pp]


def _matches(s: Strategy, ref: dict[str, str]) -> int:
    return sum(s.sharding[op] == choice for op, choice in ref.items())


def _replicated_experts(s: Strategy) -> bool:
    return _matches(s, _REPLICATED_EXPERTS) == len(_REPLICATED_EXPERTS)


def _pipelined(out: Mapping, d: Deployment, env_var: str) -> None:
    """Serving engines keep one batch in flight per stage; set the layer split to ours when uneven."""
    s = d.strategy
    out.microbatches = s.pp if s.pp > 1 else 1
    out.microbatches_rule = "= pp" if s.pp > 1 else "no pipeline"
    parts = partition(d.model, s.pp)
    if len(set(parts)) > 1:
        out.env[env_var] = ",".join(str(p) for p in parts)


def _multinode(out: Mapping, d: Deployment, gpus: int, how: str) -> int:
    nodes = math.ceil(gpus / d.gpus_per_node) if d.gpus_per_node else 1
    if nodes > 1:
        out.notes.append(f"one launch spans {gpus} GPUs = {nodes} nodes of {d.gpus_per_node}: {how}")
    return nodes


def vllm(d: Deployment) -> Mapping:
    s, m = d.strategy, d.model
    out = Mapping(program=["vllm", "serve", d.model_path])
    out.add("--tensor-parallel-size", s.tp, "--pipeline-parallel-size", s.pp)
    if m.is_moe:
        if s.ep > 1:
            out.add("--data-parallel-size", s.ep)
        if s.ep > 1 or d.moe_ep > 1:
            out.add("--enable-expert-parallel")
            if s.tp > 1 and d.moe_ep != s.tp:
                out.notes.append(
                    f"vLLM's expert parallelism spans all tp*ep = {s.tp * s.ep} GPUs of a stage with whole "
                    f"experts (EP={s.tp * s.ep}); the plan has EP={s.ep * d.moe_ep} x expert-TP={s.tp // d.moe_ep}: "
                    f"same expert memory per GPU, other GEMMs and routing balance; moe_ep={s.tp} is what vLLM runs")
        if s.dp > 1:
            out.notes.append(f"vLLM's --data-parallel-size synchronizes an MoE model's ranks in every MoE layer, "
                             f"so the plan's dp={s.dp} independent replicas are separate launches")
        out.replicas = s.dp
        seqs = math.ceil(s.batch / s.ep)
    else:
        if s.dp > 1:
            out.add("--data-parallel-size", s.dp)
        seqs = s.batch
    out.add("--max-num-seqs", seqs)
    _pipelined(out, d, "VLLM_PP_LAYER_PARTITION")
    if d.precision == "fp8":
        out.add("--quantization", "fp8")
    elif d.precision == "bf16":
        out.add("--dtype", "bfloat16")
    if d.kv_fp8:
        out.add("--kv-cache-dtype", "fp8")
    elif d.precision == "fp8":
        out.add("--kv-cache-dtype", "auto")  # the model's activation dtype, BF16
    gpus = s.tp * s.pp * (s.ep if m.is_moe else s.dp)
    _multinode(out, d, gpus, "start a Ray cluster first (vLLM's multi-node executor), or for data "
               "parallelism launch per node with --data-parallel-size-local and --data-parallel-address")
    return out


def sglang(d: Deployment) -> Mapping:
    s, m = d.strategy, d.model
    width = s.tp * s.ep
    out = Mapping(program=["python", "-m", "sglang.launch_server", "--model-path", d.model_path])
    out.add("--tp-size", width)
    if s.pp > 1:
        out.add("--pp-size", s.pp)
    dp_heads = s.tp > 1 and _matches(s, _DP_ATTN) > _matches(s, _TP_ATTN)
    attn_dp = width if dp_heads else s.ep
    out.sharding |= _DP_ATTN if dp_heads else _TP_ATTN
    if attn_dp > 1:
        out.add("--dp-size", attn_dp, "--enable-dp-attention", "--enable-dp-lm-head")
        out.sharding["embedding"] = "replicated"  # VocabParallelEmbedding(enable_tp=not dp_attention)
        out.sharding["lm_head"] = "replicated" if dp_heads else "dim1"
        out.replicas = s.dp
        if s.dp > 1:
            out.notes.append(f"--dp-size holds the DP-attention groups, so the plan's dp={s.dp} replicas are "
                             "separate launches (e.g. behind sglang-router)")
        if not m.is_moe:
            out.notes.append("SGLang implements DP attention for some models only (DeepSeek, Qwen-MoE, ...)")
    elif s.dp > 1:
        out.add("--dp-size", s.dp)
    if m.is_moe:
        _sglang_moe(out, d, attn_dp)
    out.add("--max-running-requests", s.batch)
    _pipelined(out, d, "SGLANG_PP_LAYER_PARTITION")
    if s.pp > 1:  # per scheduler: one per DP-attention group
        out.add("--pp-max-micro-batch-size", math.ceil(s.batch / (attn_dp * s.pp)))
    if d.precision == "fp8":
        out.add("--quantization", "fp8")
    elif d.precision == "bf16":
        out.add("--dtype", "bfloat16")
    if d.kv_fp8:
        out.add("--kv-cache-dtype", "fp8_e4m3")
    elif d.precision == "fp8":
        out.add("--kv-cache-dtype", "auto")  # the model's activation dtype, BF16
    gpus = width * s.pp * (1 if attn_dp > 1 else s.dp)
    if _multinode(out, d, gpus, "run the command on each node with its --node-rank") > 1:
        out.add("--nnodes", math.ceil(gpus / d.gpus_per_node), "--node-rank", "${NODE_RANK}",
                "--dist-init-addr", "${MASTER_ADDR}:5000")
    return out


def _sglang_moe(out: Mapping, d: Deployment, attn_dp: int) -> None:
    """Experts: EP=ep x moe_ep with MoE-TP=tp / moe_ep (EP groups strided by MoE-TP, as ours) or MoE-DP=tp
    (replicated)."""
    s, m = d.strategy, d.model
    if s.ep * d.moe_ep > 1:
        out.add("--ep-size", s.ep * d.moe_ep)
    if s.tp > 1 and _replicated_experts(s):
        out.add("--moe-dp-size", s.tp)
        out.sharding |= _REPLICATED_EXPERTS
        out.notes.append("--moe-dp-size replicates experts over MoE-DP groups that stride across the EP "
                         "groups (ours are consecutive GPUs); same memory and FLOPs, placement not priced")
    dense = {"dense_ffn1": "replicated", "dense_ffn2": "replicated"}
    if m.num_dense_layers > 0 and _matches(s, dense) == 2:
        out.add("--moe-dense-tp-size", 1)
        out.sharding |= dense
    elif attn_dp > 1 and s.ep > 1 and (m.num_dense_layers > 0 or m.num_shared_experts > 0):
        out.notes.append(f"SGLang shards the dense MLP and shared experts over all tp*ep = {s.tp * s.ep} GPUs "
                         f"of a stage (tokens gathered across DP-attention groups); the plan shards them "
                         f"over tp = {s.tp}; priced as over tp")


def megatron(d: Deployment) -> Mapping:
    s, m = d.strategy, d.model
    gpus = s.gpus
    nodes = math.ceil(gpus / d.gpus_per_node) if d.gpus_per_node else 1
    per_node = min(gpus, d.gpus_per_node or gpus)
    out = Mapping(program=["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
                           "tools/run_text_generation_server.py", "${MODEL_ARGS}", "--load", "${CHECKPOINT}"])
    out.add("--tensor-model-parallel-size", s.tp, "--pipeline-model-parallel-size", s.pp)
    if s.tp > 1:
        out.add("--sequence-parallel")
    if m.is_moe:
        etp = 1 if _replicated_experts(s) else s.tp
        out.add("--expert-model-parallel-size", s.ep, "--expert-tensor-parallel-size", etp)
        if etp == 1:
            out.sharding |= _REPLICATED_EXPERTS
            if s.tp > 1:
                out.notes.append("with --expert-tensor-parallel-size 1 Megatron-Core orders expert ranks "
                                 "EP-first (EP groups are consecutive GPUs, ours stride by tp); not priced")
    out.add("--micro-batch-size", math.ceil(s.batch / (s.ep * s.microbatches)),
            "--inference-max-requests", math.ceil(s.batch / s.ep))
    out.microbatches, out.microbatches_rule = s.microbatches, "as planned"
    parts = partition(m, s.pp)
    if len(set(parts)) > 1:
        if len(set(parts[1:-1])) <= 1:
            out.add("--decoder-first-pipeline-num-layers", parts[0], "--decoder-last-pipeline-num-layers", parts[-1])
        else:
            out.notes.append(f"Megatron sets only the first and last stage's layer counts; the plan's split "
                             f"{parts} is not expressible (layers are split evenly otherwise)")
    out.add("--bf16")
    if d.precision == "fp8":
        out.add("--fp8-format", "hybrid")
    out.notes.append(f"Megatron's data-parallel size is implied: world / (tp*pp) = ep*dp = {s.ep * s.dp}; "
                     f"each data-parallel rank is one attention group serving --inference-max-requests sequences")
    if s.pp > 1 and s.microbatches > 1:
        out.notes.append("the static engine pipelines micro-batches only above "
                         "--inference-batch-times-seqlen-threshold; set it below batch x sequence length")
    out.notes.append("${MODEL_ARGS}: the model's architecture flags (--num-layers, --hidden-size, ...) from its "
                     "training script; ${CHECKPOINT}: a Megatron checkpoint of the model")
    return out


MAPPERS = {"vllm": vllm, "sglang": sglang, "megatron": megatron}
