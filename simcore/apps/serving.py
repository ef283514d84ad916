"""The ``serving`` config node and ``shard-sim workload=serving``: one serving plan, request by request.

``workload=serving`` (``conf/workload/serving.yaml``, ``workload.phase: serving``) switches both apps
to request-level serving (:mod:`simcore.serving`): ``shard-sim`` simulates one plan (``plan=FILE``, a
``best_plan.yaml`` of ``shard-search workload=serving``, or ``serving.plan.*`` on the command line),
``shard-search`` searches plans (:mod:`planner.serving`). What arrives is the ``serving`` node
(:class:`ServingAppConfig`): ``serving.concurrency`` closed-loop clients, or ``serving.rate`` requests/s
(Poisson), or a ``serving.trace`` CSV (a trace is the arrivals; a rate beside it is refused); lengths
``serving.isl`` / ``serving.osl``; SLOs in milliseconds. ``export=vllm|sglang|trtllm`` also writes the
plan's launch (``launch_<target>.sh``), as ``shard-search workload=serving`` does for its best plan.

Bad input (a concurrency of 0, an unknown runtime, a trace with a missing column or a negative length,
a plan larger than the cluster or one whose pool cannot split the model, requests longer than the model's
context window, a plan no runtime can launch under ``export=``) is a :class:`~simcore.apps.common.UserError` naming the field: one
line, exit code 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from simcore.apps.common import UserError

__all__ = ["PoolConfig", "ServingPlanConfig", "ServingSearchConfig", "ServingAppConfig", "build_serving_config",
           "build_serving_context", "plan_from_dict", "plan_from_config", "load_serving_plan", "is_serving",
           "run_serving_sim", "metrics_row", "plan_launch", "write_launch"]


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
    ``network``: KV hand-offs of disaggregated plans as flows on the topology (else idle-fabric time)."""

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
    plan: ServingPlanConfig = field(default_factory=ServingPlanConfig)
    search: ServingSearchConfig = field(default_factory=ServingSearchConfig)


def is_serving(cfg) -> bool:
    return str(cfg.workload.phase) == "serving"


def _length(mean, std: float, name: str):
    from simcore.serving import LengthDist

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
    from simcore.config import slo_seconds
    from simcore.serving import ServingConfig, ServingInputError, read_trace

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
    from omegaconf import OmegaConf

    from simcore.config import build_cluster, build_engine_config, build_workload
    from simcore.lowering import CostContext
    from simcore.models import get_model

    s = cfg.serving
    # the scenario's workload fields (precision, ...) with the serving lengths; SLOs live in serving.*
    workload = build_workload(OmegaConf.merge(cfg.workload, {"phase": "decode", "input_len": int(s.isl),
                                                             "output_len": int(s.osl), "ttft_slo_ms": None,
                                                             "tpot_slo_ms": None}))
    routing = build_engine_config(cfg.sim).routing if "sim" in cfg else None
    model = get_model(cfg.model.name)
    window = model.max_position_embeddings  # the runtimes' default max_model_len; 0: not in the config
    if window and int(s.isl) + int(s.osl) > window:
        raise UserError(f"serving.isl + serving.osl: {int(s.isl)} + {int(s.osl)} tokens exceed {model.name}'s "
                        f"context window of {window} (max_position_embeddings), which a runtime would refuse")
    return CostContext(model=model, workload=workload,
                       cluster=build_cluster(cfg.topology, cfg.hardware), routing=routing)


def _pool(d: dict, role: str):
    from simcore.serving import Pool, ServingInputError, runtime_strategy

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
    from simcore.serving import ServingInputError, ServingPlan

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
    from omegaconf import OmegaConf

    return plan_from_dict(OmegaConf.to_container(plan_cfg, resolve=True))


def load_serving_plan(path: str | Path, model: str | None = None):
    """The plan of a ``best_plan.yaml`` written by ``shard-search workload=serving``."""
    import yaml

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


def metrics_row(result) -> dict:
    """One flat row (ms, tokens/s) of a :class:`~simcore.serving.ServingResult`."""
    row = {"plan": result.plan.describe(), "mode": result.plan.mode, "gpus": result.plan.gpus,
           "feasible": result.feasible, "reason": result.reason}
    m = result.metrics
    if m is not None:
        row |= {"ttft_ms": m.ttft_s["mean"] * 1e3, "ttft_p90_ms": m.ttft_s["p90"] * 1e3,
                "tpot_ms": m.tpot_s["mean"] * 1e3, "tpot_p90_ms": m.tpot_s["p90"] * 1e3,
                "tokens_per_s_per_gpu": m.output_tokens_per_s_per_gpu,
                "tokens_per_s_per_user": m.tokens_per_s_per_user, "requests_per_s": m.requests_per_s,
                "goodput": m.goodput, "goodput_tokens_per_s_per_gpu": m.goodput_tokens_per_s_per_gpu}
    return row


def _table(title: str, result, scfg):
    from rich.table import Table

    table = Table(title=title)
    for col in ("metric", "mean", "p50", "p90", "p99"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    m = result.metrics
    for name, stats in (("TTFT (ms)", m.ttft_s), ("TPOT (ms)", m.tpot_s), ("ITL (ms)", m.itl_s),
                        ("E2E (ms)", m.e2e_s)):
        table.add_row(name, *(f"{stats[q] * 1e3:,.1f}" for q in ("mean", "p50", "p90", "p99")))
    for name, value in (("output tokens/s/GPU", m.output_tokens_per_s_per_gpu),
                        ("tokens/s/user", m.tokens_per_s_per_user), ("requests/s", m.requests_per_s),
                        ("goodput (share meeting SLOs)", m.goodput),
                        ("goodput tokens/s/GPU", m.goodput_tokens_per_s_per_gpu)):
        table.add_row(name, f"{value:,.3f}" if value < 10 else f"{value:,.1f}", "", "", "")
    return table


def decode_step_breakdowns(ctx, plan, runtime, result) -> dict:
    """Each pool's mean pure-decode step of the run (:func:`simcore.serving.breakdown.step_breakdown` at
    :func:`~simcore.serving.breakdown.mean_decode_batches`), by role; pools that took none are left out."""
    from simcore.serving import StepCost
    from simcore.serving.breakdown import mean_decode_batches, step_breakdown

    out = {}
    for role, pool in plan.pools:
        batches = mean_decode_batches(result.pool_stats.get(role, {}), pool.strategy.ep, 1 + runtime.spec_tokens)
        if batches:
            out[role] = step_breakdown(StepCost(ctx, pool.strategy, runtime, pool.moe_ep), batches, runtime)
    return out


def _breakdown_table(title: str, steps: dict, stats: dict, mode: str):
    """Rows: each part of :data:`simcore.serving.breakdown.PARTS` any pool has, then the totals; a column
    per pool (per layout of a seesaw plan)."""
    from rich.table import Table

    from simcore.serving.breakdown import PARTS

    table = Table(title=title)
    table.add_column("ms per step")
    roles = list(steps)
    for role in roles:
        table.add_column("pool" if role == "both" else f"{role} {'layout' if mode == 'seesaw' else 'pool'}",
                         justify="right")
    for part in PARTS:
        if any(part in steps[r].parts for r in roles):
            table.add_row(part, *(f"{steps[r].parts.get(part, 0.0) * 1e3:,.3f}" for r in roles))
    table.add_row("GPU time", *(f"{steps[r].gpu_s * 1e3:,.3f}" for r in roles))
    table.add_row("host time", *(f"{steps[r].host_s * 1e3:,.3f}" for r in roles))
    table.add_row("step (what sets it)", *(f"{steps[r].step_s * 1e3:,.3f} ({steps[r].bound})" for r in roles))
    table.add_row("sequences x mean context",
                  *(f"{steps[r].sequences} x {stats[r]['mean_decode_context']:,.0f}" for r in roles))
    table.add_row("GPUs busy over the run", *(f"{stats[r]['gpu_busy_share']:.0%}" for r in roles))
    return table


def plan_launch(plan, ctx, graph, scfg, target: str):
    """``plan``'s launch configuration on ``target`` (:func:`simcore.export.serving.serving_launch`): the
    simulated runtime's profile where it is the target's (its token budgets, memory fraction and
    speculative decoding), else the target's own; nodes of ``graph``'s size (else the NVLink domain's)."""
    from simcore.export.serving import serving_launch

    gpn = int(graph.graph.get("gpus_per_node", 0)) if graph is not None else ctx.cluster.nvlink_domain_size
    simulated = scfg.runtime_profile()
    return serving_launch(plan, ctx.model, target, gpus_per_node=gpn or None, precision=ctx.workload.precision,
                          kv_precision=ctx.workload.kv_precision, isl=int(scfg.input_len.mean),
                          runtime=simulated if simulated.scheduler == target else None)


def write_launch(out: Path, launch) -> list[str]:
    """``launch_<target>.sh`` and the files it reads into ``out``, atomically; their names."""
    from simcore.apps.common import atomic_write_text

    atomic_write_text(out / f"launch_{launch.target}.sh", launch.to_text())
    for name, text in launch.files.items():
        atomic_write_text(out / name, text)
    return [f"launch_{launch.target}.sh", *launch.files]


def run_serving_sim(cfg) -> dict:
    """``shard-sim workload=serving``: simulate one plan, print its latencies, write ``result.json``."""
    from simcore.apps.common import atomic_write_json, console, run_dir
    from simcore.config import build_graph
    from simcore.serving import ServingInputError, shape_error, simulate_serving
    from simcore.serving.plan import check_expert_layout

    scfg = build_serving_config(cfg.serving)
    plan = load_serving_plan(cfg.plan, cfg.model.name) if cfg.plan else plan_from_config(cfg.serving.plan)
    ctx = build_serving_context(cfg)
    if plan.gpus > ctx.cluster.num_gpus:
        raise UserError(f"serving.plan: {plan.describe()} needs {plan.gpus} GPUs, the cluster has "
                        f"{ctx.cluster.num_gpus}")
    for role, pool in plan.pools:  # a layout that cannot split the model is bad input, as in static shard-sim
        where = "plan" if cfg.plan else f"serving.plan.{'pool' if role == 'both' else role}"
        try:
            check_expert_layout(pool.strategy, pool.moe_ep, ctx.model)
        except ServingInputError as exc:
            raise UserError(str(exc).replace("pool.moe_ep", f"{where}.moe_ep", 1)) from None
        shape = shape_error(ctx, role, pool.strategy)
        if shape:
            raise UserError(f"{where}: {shape}")
    graph = build_graph(cfg.topology, cfg.hardware) if cfg.serving.network else None
    launch = None
    if cfg.get("export") is not None:  # built before simulating: a target or plan it cannot launch is bad input
        try:
            launch = plan_launch(plan, ctx, graph, scfg, str(cfg.export))
        except ValueError as exc:
            raise UserError(str(exc)) from None
    result = simulate_serving(ctx, plan, scfg, graph=graph)
    con = console()
    load = f"{scfg.concurrency} clients" if scfg.arrival == "closed" else \
        (f"{scfg.rate:g} req/s" if scfg.arrival == "poisson" else f"trace {Path(scfg.trace).name}")
    title = (f"{cfg.scenario}: {ctx.model.name} on {ctx.cluster.num_gpus} x {ctx.cluster.gpu.name}, "
             f"{scfg.runtime}, {load}, ISL {cfg.serving.isl} OSL {cfg.serving.osl}: {plan.describe()}")
    slo = {"ttft_ms": cfg.serving.ttft_slo_ms, "tpot_ms": cfg.serving.tpot_slo_ms}
    if result.feasible:
        con.print(_table(title, result, scfg))
        m = result.metrics
        misses = [f"{k[:-3].upper()} {v:,.1f} ms > {slo[k]:g} ms" for k, v in
                  (("ttft_ms", m.ttft_s["mean"] * 1e3), ("tpot_ms", m.tpot_s["mean"] * 1e3))
                  if slo[k] is not None and v > slo[k]]
        con.print("SLOs: " + ("met (mean TTFT and TPOT)" if not misses else "missed: " + "; ".join(misses)))
        if plan.mode == "seesaw":
            con.print(f"seesaw: {result.switches} layout switches, {result.reshard_s * 1e3:,.1f} ms re-sharding")
        steps = decode_step_breakdowns(ctx, plan, plan.runtime_for(scfg.runtime_profile()), result)
        if steps:
            con.print(_breakdown_table("the run's mean decode step", steps, result.pool_stats, plan.mode))
    else:
        steps = {}
        con.print(f"{title}\n[red]infeasible[/red]: {result.reason}")
    out = run_dir()
    spec = plan.runtime_for(scfg.runtime_profile())  # a searched plan's own speculative decoding
    payload = {"scenario": cfg.scenario, "model": ctx.model.name, "gpus": ctx.cluster.num_gpus,
               "serving": {"arrival": scfg.arrival, "concurrency": scfg.concurrency, "rate": scfg.rate,
                           "num_requests": scfg.num_requests, "runtime": scfg.runtime, "isl": cfg.serving.isl,
                           "osl": cfg.serving.osl, "slo": slo, "spec_tokens": spec.spec_tokens,
                           "spec_accept": list(spec.spec_accept[:spec.spec_tokens])},
               "result": result.to_dict(), "mean_decode_step": {r: b.to_ms_dict() for r, b in steps.items()}}
    atomic_write_json(out / "result.json", payload)
    written = ["result.json"]
    if launch is not None:
        print(launch.to_text())  # plain, so that it can be piped
        written += write_launch(out, launch)
    con.print(f"simulated {result.steps} steps in {result.wall_s:.2f} s; wrote {', '.join(written)} into run dir: {out}")
    return payload
