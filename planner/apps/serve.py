"""The ``serving`` config node and ``shard-sim workload=serving``: one serving plan, request by request.

``workload=serving`` (``conf/workload/serving.yaml``, ``workload.phase: serving``) switches both apps
to request-level serving (:mod:`simcore.serving`): ``shard-sim`` simulates one plan (``plan=FILE``, a
``best_plan.yaml`` of ``shard-search workload=serving``, or ``serving.plan.*`` on the command line),
``shard-search`` searches plans (:mod:`planner.serving`). Without a plan, ``shard-sim`` simulates one
worker of the smallest aggregated layout whose KV holds the configured load
(:func:`planner.serving.default_plan.default_plan`), and says which and why in one line (``plan_source``
in ``result.json``). What arrives is the ``serving`` node
(:class:`ServingAppConfig`): ``serving.concurrency`` closed-loop clients, or ``serving.rate`` requests/s
(Poisson), or a ``serving.trace`` CSV (a trace is the arrivals; a rate beside it is refused); lengths
``serving.isl`` / ``serving.osl``; SLOs in milliseconds. ``export=vllm|sglang|trtllm`` also writes the
plan's launch (``launch_<target>.sh``), as ``shard-search workload=serving`` does for its best plan.
Beside ``result.json`` it writes ``trace.json``, the run as a Chrome / Perfetto trace
(:mod:`simcore.serving.trace`; ``serving.trace_requests`` requests get a track).

Bad input (a concurrency of 0, an unknown runtime, a trace with a missing column or a negative length,
a plan larger than the cluster, a tensor- or expert-parallel group that does not fit the topology's nodes
(``serving.plan.decode.ep``: more GPUs than it has, part of a node across nodes, a non-divisor inside
one), a ``topology.fabric`` the preset does not know, one whose pool cannot split the model, requests longer than the model's
context window, a plan no runtime can launch under ``export=``, a given plan that cannot serve the load,
e.g. whose weights leave no KV cache) is a :class:`~planner.apps.common.UserError` naming the field: one
line, exit code 2.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from rich.table import Table

from planner.apps.common import UserError, atomic_write_json, atomic_write_text, console, run_dir, typed_keys
from planner.serving.config import (
    ServingPlanConfig,
    build_serving_config,
    build_serving_context,
    load_serving_plan,
    plan_from_config,
)
from planner.serving.default_plan import default_plan
from simcore.export.serving import serving_launch
from simcore.serving import (
    ServingInputError,
    ServingTrace,
    StepCost,
    shape_error,
    simulate_serving,
    write_serving_trace,
)
from simcore.serving.breakdown import PARTS, mean_decode_batches, step_breakdown
from simcore.serving.kvcache import pool_memory
from simcore.serving.plan import check_expert_layout
from topologies.scenario import build_graph

__all__ = ["run_serving_sim", "metrics_row", "plan_launch", "write_launch"]


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

    out = {}
    for role, pool in plan.pools:
        batches = mean_decode_batches(result.pool_stats.get(role, {}), pool.strategy.ep, 1 + runtime.spec_tokens)
        if batches:
            out[role] = step_breakdown(StepCost(ctx, pool.strategy, runtime, pool.moe_ep), batches, runtime)
    return out


def _breakdown_table(title: str, steps: dict, stats: dict, mode: str):
    """Rows: each part of :data:`simcore.serving.breakdown.PARTS` any pool has, then the totals; a column
    per pool (per layout of a seesaw plan)."""


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
    if any(stats[r].get("network_wait_s_per_step", 0.0) > 0 for r in roles):  # measured, beyond the closed form
        table.add_row("+ waiting on the network (mean of all steps)",
                      *(f"{stats[r].get('network_wait_s_per_step', 0.0) * 1e3:,.3f}" for r in roles))
    table.add_row("sequences x mean context",
                  *(f"{steps[r].sequences} x {stats[r]['mean_decode_context']:,.0f}" for r in roles))
    table.add_row("GPUs busy over the run", *(f"{stats[r]['gpu_busy_share']:.0%}" for r in roles))
    return table


def plan_launch(plan, ctx, graph, scfg, target: str):
    """``plan``'s launch configuration on ``target`` (:func:`simcore.export.serving.serving_launch`): the
    simulated runtime's profile where it is the target's (its token budgets, memory fraction and
    speculative decoding), else the target's own; nodes of ``graph``'s size (else the NVLink domain's)."""

    gpn = int(graph.graph.get("gpus_per_node", 0)) if graph is not None else ctx.cluster.nvlink_domain_size
    simulated = scfg.runtime_profile()
    return serving_launch(plan, ctx.model, target, gpus_per_node=gpn or None, precision=ctx.workload.precision,
                          kv_precision=ctx.workload.kv_precision, isl=int(scfg.input_len.mean),
                          runtime=simulated if simulated.scheduler == target else None)


def write_launch(out: Path, launch) -> list[str]:
    """``launch_<target>.sh`` and the files it reads into ``out``, atomically; their names."""

    atomic_write_text(out / f"launch_{launch.target}.sh", launch.to_text())
    for name, text in launch.files.items():
        atomic_write_text(out / name, text)
    return [f"launch_{launch.target}.sh", *launch.files]


def _given_plan(cfg) -> str | None:
    """Where the run's plan was given: ``plan=FILE``, ``serving.plan.*`` typed on the command line or set
    by a config file (the composed node differs from the schema's defaults); ``None``: no plan given."""
    if cfg.plan:
        return f"plan={cfg.plan}"
    if any(k == "serving.plan" or k.startswith("serving.plan.") for k in typed_keys()):
        return "serving.plan.* on the command line"
    if OmegaConf.to_container(cfg.serving.plan, resolve=True) != OmegaConf.to_container(
            OmegaConf.structured(ServingPlanConfig())):
        return "serving.plan of the config"
    return None


def _plan(cfg, ctx, scfg, given: str | None):
    """The plan to simulate and where it comes from (``plan_source``: ``given``, where the plan was given,
    or the line that says which default plan was picked and why)."""
    if given is None:
        return default_plan(ctx, scfg, int(ServingPlanConfig().pool.max_num_seqs))
    return (load_serving_plan(cfg.plan, cfg.model.name) if cfg.plan else plan_from_config(cfg.serving.plan)), given


def _trace(cfg) -> ServingTrace:
    try:
        return ServingTrace(cfg.serving.get("trace_requests", 64))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _group_error(size: int, node: int, gpus: int) -> str | None:
    """Why a group of ``size`` GPUs does not fit nodes of ``node`` GPUs (``None``: it does): more GPUs than
    the topology has; across nodes, not whole nodes; inside one, not a divisor of it (the simulator packs a
    pool's groups back to back, so such groups would straddle two nodes). A node that is a rack-scale
    NVLink domain (more than 8 GPUs, GB200 NVL72) takes any group that fits it."""
    if size > gpus:
        return f"needs more GPUs than the topology's {gpus}"
    if size > node and size % node:
        return f"spans nodes of {node} GPUs unevenly: take whole nodes (a multiple of {node})"
    if size < node <= 8 and node % size:
        return f"would straddle nodes of {node} GPUs: take a divisor of {node} or whole nodes"
    return None


def _check_groups(where: str, pool, ctx) -> None:
    """A pool's tensor-parallel group (``tp``) and its expert-parallel group (``tp x ep``: the attention
    DP groups whose experts it splits) must fit the topology's nodes (:func:`_group_error`), as the runtimes
    lay them out: SGLang and vLLM run tensor and expert parallelism across nodes on whole nodes."""
    node, gpus = ctx.cluster.nvlink_domain_size, ctx.cluster.num_gpus
    s = pool.strategy
    for field, size in (("tp", s.tp), ("ep", s.tp * s.ep)):
        reason = _group_error(size, node, gpus)
        if reason:
            label = "tensor-parallel group" if field == "tp" else f"expert-parallel group (tp {s.tp} x ep {s.ep})"
            raise UserError(f"{where}.{field}: the {label} is {size} GPUs and {reason}")


def _check_layouts(cfg, ctx, plan) -> None:
    """Refuse a plan larger than the cluster, one whose tensor- or expert-parallel group does not fit the
    topology's nodes (:func:`_check_groups`), or one whose pool cannot split the model (bad input, as in
    static shard-sim), naming where it was given."""
    for role, pool in plan.pools:
        where = "plan" if cfg.plan else f"serving.plan.{'pool' if role == 'both' else role}"
        try:
            check_expert_layout(pool.strategy, pool.moe_ep, ctx.model)
        except ServingInputError as exc:
            raise UserError(str(exc).replace("pool.moe_ep", f"{where}.moe_ep", 1)) from None
        shape = shape_error(ctx, role, pool.strategy)
        if shape:
            raise UserError(f"{where}: {shape}")
        _check_groups(where, pool, ctx)
    if plan.gpus > ctx.cluster.num_gpus:
        raise UserError(f"serving.plan: {plan.describe()} needs {plan.gpus} GPUs, the cluster has "
                        f"{ctx.cluster.num_gpus}")


def _print_result(con, title: str, ctx, plan, scfg, result, slo: dict) -> dict:
    """The latency table, the SLO verdict and the mean decode step; returns the latter by role."""
    con.print(_table(title, result, scfg))
    m = result.metrics
    misses = [f"{k[:-3].upper()} {v:,.1f} ms > {slo[k]:g} ms" for k, v in
              (("ttft_ms", m.ttft_s["mean"] * 1e3), ("tpot_ms", m.tpot_s["mean"] * 1e3))
              if slo[k] is not None and v > slo[k]]
    con.print("SLOs: " + ("met (mean TTFT and TPOT)" if not misses else "missed: " + "; ".join(misses)))
    if plan.mode == "seesaw":
        con.print(f"seesaw: {result.switches} layout switches, {result.reshard_s * 1e3:,.1f} ms re-sharding")
    deployed_ctx, runtime = scfg.deployment.deployed(ctx, plan, plan.runtime_for(scfg.runtime_profile()))
    steps = decode_step_breakdowns(deployed_ctx, plan, runtime, result)  # as simulated: kernels, padding
    if steps:
        con.print(_breakdown_table("the run's mean decode step", steps, result.pool_stats, plan.mode))
    return steps


def _memory_table(memory: dict[str, dict[str, float]]) -> Table:
    """Per-GPU memory of each pool, by part, in GB (:func:`simcore.serving.kvcache.pool_memory`)."""
    table = Table(title="memory per GPU, GB (the fullest GPU of each pool)")
    parts = ("weights", "kv_cache", "activations", "runtime_reserved", "workspace", "total", "capacity", "headroom")
    table.add_column("pool")
    for part in parts:
        table.add_column(part.replace("_", " "), justify="right")
    for role, m in memory.items():
        table.add_row(role, *(f"{m[f'{part}_bytes'] / 1e9:,.1f}" for part in parts))
    return table


def run_serving_sim(cfg) -> dict:
    """``shard-sim workload=serving``: simulate one plan (the given one, else :func:`default_plan`'s), print
    its latencies, write ``result.json`` and ``trace.json``."""

    scfg = build_serving_config(cfg.serving, model=cfg.model.name)
    ctx = build_serving_context(cfg)
    trace = _trace(cfg)
    given = _given_plan(cfg)
    plan, source = _plan(cfg, ctx, scfg, given)
    _check_layouts(cfg, ctx, plan)
    graph = build_graph(cfg.topology, cfg.hardware) if cfg.serving.network else None
    launch = None
    if cfg.get("export") is not None:  # built before simulating: a target or plan it cannot launch is bad input
        try:
            launch = plan_launch(plan, ctx, graph, scfg, str(cfg.export))
        except ValueError as exc:
            raise UserError(str(exc)) from None
    con = console()
    if given is None:
        con.print(source, soft_wrap=True)  # one line, however narrow the terminal
    contention = bool(cfg.sim.contention) if cfg.get("sim") is not None else True  # sim=proxy-equivalent: off
    result = simulate_serving(ctx, plan, scfg, graph=graph, trace=trace, contention=contention)
    if not result.feasible:  # a plan that cannot serve this load is bad input, as one that cannot split the model
        raise UserError(f"{'plan' if cfg.plan else 'serving.plan'}: {plan.describe()} cannot serve this load: "
                        f"{result.reason}")
    load = f"{scfg.concurrency} clients" if scfg.arrival == "closed" else \
        (f"{scfg.rate:g} req/s" if scfg.arrival == "poisson" else f"trace {Path(scfg.trace).name}")
    title = (f"{cfg.scenario}: {ctx.model.name} on {ctx.cluster.num_gpus} x {ctx.cluster.gpu.name}, "
             f"{scfg.runtime}, {load}, ISL {cfg.serving.isl} OSL {cfg.serving.osl}: {plan.describe()}")
    slo = {"ttft_ms": cfg.serving.ttft_slo_ms, "tpot_ms": cfg.serving.tpot_slo_ms}
    steps = _print_result(con, title, ctx, plan, scfg, result, slo)
    runtime = plan.runtime_for(scfg.runtime_profile())
    memory = {role: pool_memory(ctx, pool.strategy, runtime) for role, pool in plan.pools}
    con.print(_memory_table(memory))
    out = run_dir()
    spec = plan.runtime_for(scfg.runtime_profile())  # a searched plan's own speculative decoding
    payload = {"scenario": cfg.scenario, "model": ctx.model.name, "gpus": ctx.cluster.num_gpus, "plan_source": source,
               "serving": {"arrival": scfg.arrival, "concurrency": scfg.concurrency, "rate": scfg.rate,
                           "num_requests": scfg.num_requests, "runtime": scfg.runtime, "isl": cfg.serving.isl,
                           "osl": cfg.serving.osl, "slo": slo, "spec_tokens": spec.spec_tokens,
                           "spec_accept": list(spec.spec_accept[:spec.spec_tokens]),
                           # the deployment as simulated: the release's profile, the formats
                           "runtime_profile": spec.name, "runtime_version": scfg.deployment.runtime_version,
                           "expert_format": scfg.deployment.expert_format,
                           "kv_dtype": ctx.workload.kv_precision or ctx.workload.precision},
               "memory": memory, "result": result.to_dict(), "mean_decode_step": {r: b.to_ms_dict() for r, b in steps.items()}}
    atomic_write_json(out / "result.json", payload)
    size = write_serving_trace(out / "trace.json", trace).stat().st_size
    written = ["result.json", f"trace.json ({size / 1e6:.1f} MB)"]
    if launch is not None:
        print(launch.to_text())  # plain, so that it can be piped
        written += write_launch(out, launch)
    net = result.network
    if net and net.get("flows"):
        ran = "; ".join(f"{role}: {', '.join(kinds)}" for role, kinds in net.get("step_flows", {}).items()) or "KV hand-offs only"
        con.print(f"network: {net['flows']:,} flows ({ran}); busiest link {net['busiest_link']} at "
                  f"{net['busiest_utilization']:.1%}; {net['network_wait_share']:.2%} of step time waiting on the network",
                  soft_wrap=True)
    con.print(f"simulated {result.steps} steps in {result.wall_s:.2f} s; wrote {', '.join(written)} into run dir: {out}")
    return payload
