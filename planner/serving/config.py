"""The ``serving`` config node: its schema (:class:`ServingAppConfig`) and what it builds.

Both apps read it under ``workload=serving``: ``shard-sim`` (:mod:`planner.apps.serve`) simulates one
plan and ``shard-search`` (:mod:`planner.apps.serving_search`) searches plans. A bad field raises
:class:`~planner.apps.common.UserError` naming it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from planner.errors import UserError
from simcore.config import build_engine_config, build_workload, slo_seconds
from simcore.cost.lowering import CostContext
from simcore.models.quantization import EXPERT_FORMATS, checkpoint_expert_format
from simcore.serving import (
    LengthDist,
    Pool,
    ServingConfig,
    ServingInputError,
    ServingPlan,
    read_trace,
    runtime_strategy,
)
from simcore.serving.deployment import Deployment, LaunchFlags
from topologies.scenario import build_cluster, model_of

__all__ = ["PoolConfig", "ServingPlanConfig", "ServingSearchConfig", "ServingAppConfig", "build_serving_config",
           "build_serving_context", "plan_from_dict", "plan_from_config", "load_serving_plan", "is_serving"]


@dataclass
class PoolConfig:
    """One pool of a plan typed on the command line: ``workers`` replicas of ``tp * ep * pp`` GPUs;
    ``moe_ep``: the experts split that many ways whole inside each TP group (1: expert TP;
    :class:`simcore.serving.Pool`)."""

    tp: int = 1
    ep: int = 1
    pp: int = 1
    workers: int = 1
    max_num_seqs: int = 256
    moe_ep: int = 1


@dataclass
class ServingPlanConfig:
    """``mode`` ``agg`` serves with ``pool``; ``disagg`` prefills on ``prefill`` and decodes on ``decode``;
    ``seesaw``: each worker re-shards between the ``prefill`` and ``decode`` layouts (same ``tp*ep*pp``,
    ``workers`` and ``max_num_seqs``), parking KV in ``host_kv_bytes_per_gpu`` of host memory per GPU
    (``null``: :data:`simcore.serving.plan.HOST_KV_BYTES_PER_GPU`)."""

    mode: str = "agg"
    pool: PoolConfig = field(default_factory=PoolConfig)
    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    host_kv_bytes_per_gpu: float | None = None


@dataclass
class ServingSearchConfig:
    """``shard-search workload=serving``: ``budget`` simulated plans per method (repeats are free);
    the space: ``tp`` / ``ep`` / ``pp`` degrees of a worker (``null``: powers of two up to a node for
    tp, the experts for ep), ``max_num_seqs`` values, ``modes``, ``spec_tokens`` values (draft tokens per
    decode step, 0 = off; ``null``: not searched, ``serving.spec_tokens`` for every plan); ``moe_ep`` values
    (each pool's experts split that many ways whole inside its TP groups, 1 among them; ``null``: not
    searched, experts sharded by TP); ``loads`` multiply the configured
    concurrency (or rate) for the Pareto front, on which the ``pareto_plans`` best plans of each mode
    are simulated; ``tpot_grid_ms``: TPOT targets of the best-plan-per-SLO table (TTFT stays the
    configured one); ``exact_limit``: most plans ``planner=exact`` enumerates; ``pool_seeds``: disaggregated
    plans the warm start adds, ranked pool by pool (``planner.serving.poolwise``; one of the budget's
    eighth kept for an aggregated seed where both modes are searched), then as many aggregated plans of
    their decode layouts, or of the decode screening's without them, as the eighth still holds
    (``planner.serving.agg_seeds``); 0: none of either."""

    budget: int = 64
    tp: list[int] | None = None
    ep: list[int] | None = None
    pp: list[int] = field(default_factory=lambda: [1])
    max_num_seqs: list[int] = field(default_factory=lambda: [32, 64, 128, 256, 512, 1024])
    modes: list[str] = field(default_factory=lambda: ["agg", "disagg"])
    spec_tokens: list[int] | None = None
    moe_ep: list[int] | None = None
    loads: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0])
    pareto_plans: int = 2
    tpot_grid_ms: list[float] = field(default_factory=lambda: [20.0, 35.0, 50.0, 100.0])
    exact_limit: int = 3000
    max_proposals: int = 20  # proposals per budgeted simulation before a method is stopped
    pool_seeds: int = 4


@dataclass
class ServingAppConfig:
    """What arrives: a ``trace`` CSV (``arrival_s,input_len,output_len``) when set, else ``rate``
    requests/s (Poisson) when set, else ``concurrency`` closed-loop clients (a trace and a rate together
    are refused). ``isl`` / ``osl``: prompt and
    output tokens (``isl_std`` / ``osl_std`` > 0 draw them lognormally with that std); ``num_requests``
    (``null``: twice the concurrency, at least 256; 500 for Poisson; the whole trace); ``runtime``:
    ``vllm`` | ``sglang`` | ``trtllm`` (and the other profiles of ``simcore.serving.RUNTIMES``);
    ``mem_fraction``: the runtime's memory fraction (vLLM ``--gpu-memory-utilization``, SGLang
    ``--mem-fraction-static``, TensorRT-LLM ``free_gpu_memory_fraction``; ``null``: the profile's, for
    SGLang its own default for the GPU and layout), also written into the launch scripts; ``spec_tokens``:
    speculative decoding's draft tokens per step (0: off; the model's MTP module or an EAGLE head) with
    ``spec_accept`` the acceptance of each draft position (``null``: aiconfigurator's defaults,
    ``simcore.serving.speculative``), also written into the launch scripts; SLOs on the mean TTFT and TPOT in ms (``null``: none);
    ``network``: KV hand-offs of disaggregated plans as flows on the topology (else idle-fabric time);
    ``trace_requests``: requests ``shard-sim`` gives a track in its ``trace.json``, spread over the run
    (-1: all, 0: none; the workers' steps and the counters are always there; :mod:`simcore.serving.trace`)."""

    concurrency: int = 64
    rate: float | None = None
    trace: str | None = None
    num_requests: int | None = None
    isl: int = 4096
    osl: int = 512
    isl_std: float = 0.0
    osl_std: float = 0.0
    runtime: str = "vllm"
    mem_fraction: float | None = None
    #: host time per streamed token of the runtime's frontend process, in microseconds
    #: (simcore.serving.frontend: where steps outrun it, tokens and new requests wait in its backlog);
    #: null: the profile's (0, not fitted yet)
    frontend_token_us: float | None = None
    #: the runtime's release, ``0.12.0`` (null: the profile as it is, today's defaults); it picks what that
    #: release does by default (simcore.serving.deployment.versions): vLLM before 0.14 runs its host step
    #: synchronously (profile ``vllm-sync``), vLLM 0.12-0.14 pads FP8 experts' rows to DeepGEMM's block, and
    #: the KV cache's type without a flag (serving.kv_dtype)
    runtime_version: str | None = None
    #: the routed experts' storage format: ``mxfp4``, ``nvfp4``, ``int4_g32``, ``int4_g128`` (weight-only
    #: 4-bit with their block scales), ``fp8``, ``bf16`` (simcore.models.quantization.EXPERT_FORMATS); null:
    #: the checkpoint's 4-bit format where the model's published id or config.json (quantization_config)
    #: declares one (gpt-oss MXFP4, Kimi-K2.5 INT4), else the experts at workload.precision. On Hopper the
    #: runtimes run 4-bit experts weight-only with BF16 GEMMs: set workload.precision=bf16 with them
    expert_format: str | None = None
    #: the KV cache's element type, ``bf16`` | ``fp8`` (the runtime's --kv-cache-dtype); null:
    #: workload.kv_precision where set, else what the runtime at serving.runtime_version picks for this
    #: checkpoint (simcore.serving.deployment.kv_dtype: BF16 but for NVIDIA's ModelOpt FP8 checkpoints)
    kv_dtype: str | None = None
    #: the MoE GEMM kernels: null, the runtime's choice for the experts' format on the GPU (TensorRT-LLM
    #: runs MXFP4 experts on Hopper with its Triton backend; simcore.serving.deployment.moe_kernels);
    #: ``triton``: Triton's MoE kernels (TensorRT-LLM ``moe_config.backend: TRITON``); ``profile``: the
    #: runtime profile's own MoE constants, whatever the format
    moe_backend: str | None = None
    #: the launch flags (null: the runtime profile's value; simcore.serving.deployment.flags): the tokens
    #: one step may carry, also the prefill chunk (vLLM --max-num-batched-tokens, SGLang
    #: --chunked-prefill-size, TensorRT-LLM max_num_tokens)
    max_num_batched_tokens: int | None = None
    #: the largest step, in tokens, replayed from a CUDA graph (vLLM max-cudagraph-capture-size, SGLang
    #: --cuda-graph-max-bs, TensorRT-LLM cuda_graph_config.max_batch_size)
    cuda_graph_max_bs: int | None = None
    #: the host's step overlapped with the GPU's previous one (vLLM --async-scheduling, its default from 0.14;
    #: SGLang's and TensorRT-LLM's overlap schedulers, on by default)
    async_scheduling: bool | None = None
    #: vLLM's DeepGEMM MoE path for FP8 experts, their rows padded to 128 per local expert (null: the
    #: release's default: on in 0.12-0.14 unless the experts split 8 ways by TP)
    deep_gemm_moe: bool | None = None
    #: TensorRT-LLM's batch waiting (batch_wait_timeout_iters, batch_wait_max_tokens_ratio)
    batch_wait_timeout_iters: int | None = None
    batch_wait_max_tokens_ratio: float | None = None
    #: TensorRT-LLM's attention_dp_config (enable_balance, timeout_iters, batching_wait_iters)
    attention_dp_balance: bool | None = None
    attention_dp_timeout_iters: int | None = None
    attention_dp_batching_wait_iters: int | None = None
    #: the expert-parallel dispatch and combine (SGLang --moe-a2a-backend): ``none`` (NCCL) | ``deepep``
    moe_a2a_backend: str | None = None
    #: the recurrent state's type of linear-attention layers (--mamba-ssm-dtype): ``bf16`` | ``fp32``;
    #: null: the model config's
    mamba_ssm_dtype: str | None = None
    #: SGLang's two-batch overlap (--enable-two-batch-overlap): each step's expert all-to-alls hidden
    #: behind the other micro-batch's compute; null: off. Refused on runtimes without it
    two_batch_overlap: bool | None = None
    #: lengths drawn uniformly over the integers [floor(range_ratio * isl), isl] (and osl's alike), as
    #: InferenceX's benchmark_serving.py --random-range-ratio; null: serving.isl_std / osl_std decide
    range_ratio: float | None = None
    spec_tokens: int = 0
    spec_accept: list[float] | None = None
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    seed: int = 0
    network: bool = True
    trace_requests: int = 64
    plan: ServingPlanConfig = field(default_factory=ServingPlanConfig)
    search: ServingSearchConfig = field(default_factory=ServingSearchConfig)


def is_serving(cfg) -> bool:
    return str(cfg.workload.phase) == "serving"


def _length(mean, std: float, name: str):

    if isinstance(mean, bool) or not isinstance(mean, int) or mean < 1:
        raise UserError(f"{name} must be a positive integer, got {mean!r}")
    if not (std >= 0 and math.isfinite(std)):
        raise UserError(f"{name}_std must be a finite number >= 0, got {std!r}")
    return LengthDist("lognormal" if std > 0 else "fixed", mean=float(mean), std=float(std), name=name)


#: the launch flags of the schema (simcore.serving.deployment.LaunchFlags), each a ``serving.*`` field
LAUNCH_FLAGS = tuple(f.name for f in dataclasses.fields(LaunchFlags))


def _deployment(s, model: str | None) -> Deployment:
    """The :class:`~simcore.serving.deployment.Deployment` of a ``serving`` node: its release, the experts'
    format (``null``: the checkpoint's 4-bit one of ``model``, a name, published id or config.json path),
    MoE backend and launch flags."""
    fmt = s.get("expert_format")
    if fmt is None and model is not None:
        fmt = checkpoint_expert_format(str(model))
    version = s.get("runtime_version")
    flags = LaunchFlags(**{name: s.get(name) for name in LAUNCH_FLAGS})
    return Deployment(runtime_version=None if version is None else str(version),
                      expert_format=None if fmt is None else str(fmt), moe_backend=s.get("moe_backend"), flags=flags)


def _lengths(s) -> tuple:
    """The prompt and output length draws: ``serving.range_ratio``'s uniform ranges, else ``*_std``'s."""
    ratio = s.get("range_ratio")
    if ratio is None:
        return _length(s.isl, float(s.isl_std), "serving.isl"), _length(s.osl, float(s.osl_std), "serving.osl")
    if not 0 < float(ratio) <= 1:
        raise UserError(f"serving.range_ratio must be in (0, 1] (or null), got {ratio!r}")
    if float(s.isl_std) or float(s.osl_std):
        raise UserError("serving.range_ratio: set together with serving.isl_std / osl_std; set one of them")
    out = []
    for name, length in (("serving.isl", s.isl), ("serving.osl", s.osl)):
        _length(length, 0.0, name)
        low = max(int(float(ratio) * length), 1)
        out.append(LengthDist(kind="uniform", mean=(low + length) / 2, low=low, high=length, name=name))
    return tuple(out)


def _frontend_token_s(v) -> float | None:
    """``serving.frontend_token_us`` in seconds (None: the profile's)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise UserError(f"serving.frontend_token_us must be a number of microseconds, got {v!r}")
    return float(v) * 1e-6


def _spec_tokens(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise UserError(f"serving.spec_tokens must be an integer >= 0, got {v!r}")
    return v


def _spec_accept(v) -> tuple[float, ...]:
    try:
        return tuple(float(a) for a in v)
    except (TypeError, ValueError):
        raise UserError(f"serving.spec_accept must be a list of rates in [0, 1], got {v!r}") from None


def build_serving_config(s, load: float = 1.0, model: str | None = None):
    """The :class:`~simcore.serving.ServingConfig` of a composed ``serving`` node, its concurrency or
    rate scaled by ``load``; ``model``: the ``model.name`` served, whose checkpoint says its experts' format
    where ``serving.expert_format`` is null; a bad field raises :class:`UserError` naming it (the trace is
    read here)."""

    if s.trace and s.rate is not None:  # the trace's own arrival times would silently replace the rate
        raise UserError(f"serving.rate: {s.rate!r} set together with serving.trace, whose rows carry their own "
                        "arrival times; set one of them")
    try:
        if s.trace:
            arrival, n_default = "trace", len(read_trace(str(s.trace)))
        elif s.rate is not None:
            arrival, n_default = "poisson", 500
        else:
            arrival, n_default = "closed", max(2 * int(s.concurrency) * max(load, 1.0), 256)
        concurrency = max(int(round(int(s.concurrency) * load)), 1) if int(s.concurrency) >= 1 else int(s.concurrency)
        rate = float(s.rate) * load if s.rate is not None else 0.0
        n = int(s.num_requests) if s.num_requests is not None else int(n_default)
        input_len, output_len = _lengths(s)
        return ServingConfig(arrival=arrival, concurrency=concurrency, rate=rate,
                             trace=None if not s.trace else str(s.trace), num_requests=n,
                             input_len=input_len, output_len=output_len, runtime=str(s.runtime),
                             deployment=_deployment(s, model),
                             mem_fraction=None if s.get("mem_fraction") is None else float(s.mem_fraction),
                             frontend_token_s=_frontend_token_s(s.get("frontend_token_us")),
                             spec_tokens=_spec_tokens(s.get("spec_tokens", 0)),
                             spec_accept=None if s.get("spec_accept") is None else _spec_accept(s.spec_accept),
                             ttft_slo_s=slo_seconds(s.ttft_slo_ms, "serving.ttft_slo_ms"),
                             tpot_slo_s=slo_seconds(s.tpot_slo_ms, "serving.tpot_slo_ms"), seed=int(s.seed))
    except ServingInputError as exc:
        raise UserError(str(exc)) from None


def build_serving_context(cfg):
    """Cost context of a serving run: the scenario's model and cluster, ``workload.precision``, and
    the ``serving`` lengths (the lowering's reference lengths; each step is priced at its own)."""


    s = cfg.serving
    # the scenario's workload fields (precision, ...) with the serving lengths; SLOs live in serving.*
    workload = build_workload(OmegaConf.merge(cfg.workload, {"phase": "decode", "input_len": int(s.isl),
                                                             "output_len": int(s.osl), "ttft_slo_ms": None,
                                                             "tpot_slo_ms": None}))
    routing = build_engine_config(cfg.sim).routing if "sim" in cfg else None
    model = model_of(cfg.model)
    model, workload = _deployed_model(s, str(cfg.model.name), model, workload)
    window = model.max_position_embeddings  # the runtimes' default max_model_len; 0: not in the config
    if window and int(s.isl) + int(s.osl) > window:
        raise UserError(f"serving.isl + serving.osl: {int(s.isl)} + {int(s.osl)} tokens exceed {model.name}'s "
                        f"context window of {window} (max_position_embeddings), which a runtime would refuse")
    return CostContext(model=model, workload=workload,
                       cluster=build_cluster(cfg.topology, cfg.hardware), routing=routing)


def _deployed_model(s, name: str, model, workload):
    """The model and workload under the node's deployment: the linear-attention state's type
    (``serving.mamba_ssm_dtype``), the experts' bytes in their format (``serving.expert_format``, null: the
    checkpoint's), the KV cache's type (``serving.kv_dtype``, null: ``workload.kv_precision`` or the
    runtime's default at its release)."""
    try:
        deployment = _deployment(s, name)
        model = dataclasses.replace(model, **deployment.flags.model_fields(model))
        fmt = deployment.expert_format if model.is_moe or s.get("expert_format") is not None else None
        if fmt is not None and not model.is_moe:
            raise UserError(f"serving.expert_format: model {model.name} has no routed experts")
        expert = None if fmt is None or fmt == workload.precision else EXPERT_FORMATS[fmt]
        kv = s.get("kv_dtype")
        if kv is not None and workload.kv_precision is not None and kv != workload.kv_precision:
            raise UserError(f"serving.kv_dtype: {kv!r} differs from workload.kv_precision "
                            f"{workload.kv_precision!r}; set one of them")
        if kv is None:
            scheduler = deployment.runtime_profile(str(s.runtime)).scheduler
            kv = workload.kv_precision or deployment.kv_dtype(scheduler, name, workload.precision)
        return model, dataclasses.replace(workload, expert_weight_bytes=expert, kv_precision=str(kv))
    except (ServingInputError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        message = str(exc)  # the Workload's check of a value the serving field set names that field
        if s.get("kv_dtype") is not None:
            message = message.replace("workload.kv_precision", "serving.kv_dtype", 1)
        raise UserError(message.replace("workload.expert_weight_bytes", "serving.expert_format", 1)) from None


def _pool(d: dict, role: str):

    unknown = set(d) - {"tp", "ep", "pp", "workers", "max_num_seqs", "sharding", "dp", "batch", "moe_ep"}
    if unknown:
        raise UserError(f"serving.plan.{role}: unknown field(s) {', '.join(sorted(unknown))}")
    try:
        strategy = runtime_strategy(tp=d.get("tp", 1), ep=d.get("ep", 1), pp=d.get("pp", 1))
        if d.get("sharding"):
            strategy = strategy.replace(sharding=dict(strategy.sharding) | dict(d["sharding"]))
        return Pool(strategy, d.get("workers", 1), d.get("max_num_seqs", 256), d.get("moe_ep", 1))
    except (ServingInputError, ValueError) as exc:
        raise UserError(f"serving.plan.{role}: {exc}") from None


def plan_from_dict(d: dict):
    """A :class:`~simcore.serving.ServingPlan` from ``{mode, pool | both, prefill, decode,
    host_kv_bytes_per_gpu, spec_tokens}``."""

    mode = d.get("mode", "agg")
    spec = {} if d.get("spec_tokens") is None else {"spec_tokens": d["spec_tokens"]}
    if mode != "seesaw" and d.get("host_kv_bytes_per_gpu") is not None:
        raise UserError(f"serving.plan.host_kv_bytes_per_gpu: only a seesaw plan parks KV in host memory "
                        f"(mode is {mode!r})")
    try:
        if mode == "agg":
            return ServingPlan("agg", pool=_pool(d.get("pool") or d.get("both") or {}, "pool"), **spec)
        if mode == "disagg":
            return ServingPlan("disagg", prefill=_pool(d.get("prefill") or {}, "prefill"),
                               decode=_pool(d.get("decode") or {}, "decode"), **spec)
        if mode == "seesaw":
            host = d.get("host_kv_bytes_per_gpu")
            return ServingPlan("seesaw", prefill=_pool(d.get("prefill") or {}, "prefill"),
                               decode=_pool(d.get("decode") or {}, "decode"),
                               **({} if host is None else {"host_kv_bytes_per_gpu": host}), **spec)
        return ServingPlan(mode)
    except ServingInputError as exc:
        raise UserError(str(exc).replace("plan.", "serving.plan.", 1)) from None


def plan_from_config(plan_cfg):

    return plan_from_dict(OmegaConf.to_container(plan_cfg, resolve=True))


def load_serving_plan(path: str | Path, model: str | None = None):
    """The plan of a ``best_plan.yaml`` written by ``shard-search workload=serving``."""

    path = Path(path)
    if not path.is_file():
        raise UserError(f"plan: no such file {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"plan: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("serving_plan"), dict):
        raise UserError(f"plan: {path.name} has no serving_plan (write one with shard-search workload=serving)")
    if model is not None and data.get("model") not in (None, model):
        raise UserError(f"plan: made for model {data['model']!r}, the config has {model!r}; pass model=...")
    return plan_from_dict(data["serving_plan"])
