"""The ``serving`` config node: its schema (:class:`ServingAppConfig`) and what it builds.

Both apps read it under ``workload=serving``: ``shard-sim`` (:mod:`planner.apps.serve`) simulates one
plan and ``shard-search`` (:mod:`planner.apps.serving_search`) searches plans. A bad field raises
:class:`~planner.apps.common.UserError` naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from planner.errors import UserError
from simcore.config import build_engine_config, build_workload, slo_seconds
from simcore.cost.lowering import CostContext
from simcore.serving import (
    LengthDist,
    Pool,
    ServingConfig,
    ServingInputError,
    ServingPlan,
    read_trace,
    runtime_strategy,
)
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


def _spec_tokens(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise UserError(f"serving.spec_tokens must be an integer >= 0, got {v!r}")
    return v


def _spec_accept(v) -> tuple[float, ...]:
    try:
        return tuple(float(a) for a in v)
    except (TypeError, ValueError):
        raise UserError(f"serving.spec_accept must be a list of rates in [0, 1], got {v!r}") from None


def build_serving_config(s, load: float = 1.0):
    """The :class:`~simcore.serving.ServingConfig` of a composed ``serving`` node, its concurrency or
    rate scaled by ``load``; a bad field raises :class:`UserError` naming it (the trace is read here)."""

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
        return ServingConfig(arrival=arrival, concurrency=concurrency, rate=rate,
                             trace=None if not s.trace else str(s.trace), num_requests=n,
                             input_len=_length(s.isl, float(s.isl_std), "serving.isl"),
                             output_len=_length(s.osl, float(s.osl_std), "serving.osl"), runtime=str(s.runtime),
                             mem_fraction=None if s.get("mem_fraction") is None else float(s.mem_fraction),
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
    window = model.max_position_embeddings  # the runtimes' default max_model_len; 0: not in the config
    if window and int(s.isl) + int(s.osl) > window:
        raise UserError(f"serving.isl + serving.osl: {int(s.isl)} + {int(s.osl)} tokens exceed {model.name}'s "
                        f"context window of {window} (max_position_embeddings), which a runtime would refuse")
    return CostContext(model=model, workload=workload,
                       cluster=build_cluster(cfg.topology, cfg.hardware), routing=routing)


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
