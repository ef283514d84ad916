"""``shard-sim``: price one strategy (from the config or a ``best_plan.yaml``) and print its breakdown.

``shard-sim plan=outputs/.../best_plan.yaml`` replays a plan found by ``shard-search``;
``shard-sim strategy.tp=8 strategy.batch=64`` prices a strategy given on the command line; with
neither, ``shard-sim experiment=X`` simulates the scenario's best Megatron plan (Megatron's
per-operator sharding, the degrees and batch best under the proxy, searched over the ``planner.*``
space bounds) and says so. The scenario groups (model, topology, workload) are the same as
``shard-search``'s; a plan file is checked against them (pass the ``experiment=`` it was made for: a plan
for another model or cluster is refused, naming the scenario it was made for). ``export=vllm|sglang|megatron`` also prints the
target's launch command and the per-operator choices it cannot express, priced by proxy and
simulator (see :mod:`simcore.export`), and writes ``export_<target>.txt``.

An invalid plan (over HBM capacity, a degree that does not divide, a plan for another cluster or model)
is bad input: one line naming each reason and its numbers, exit 2, before any table or simulation.
``sim.allow_invalid=true`` prices it anyway, every figure marked INVALID (a what-if). A plan that only
misses an SLO is priced, marked INVALID: the simulator judges its latency. The table and ``result.json``
(``memory``) give the fullest GPU's memory by part and its headroom.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import hydra
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from planner.apps.common import (
    UserError,
    atomic_write_json,
    atomic_write_text,
    check_known_keys,
    cli_errors,
    config_errors_exit_2,
    console,
    run_dir,
    typed_keys,
)
from planner.apps.serve import run_serving_sim
from planner.apps.unread import check_typed_keys
from planner.serving.config import ServingAppConfig, is_serving
from simcore.config import (
    HardwareConfig,
    ModelConfig,
    SimConfig,
    SpaceConfig,
    TopologyConfig,
    WorkloadConfig,
    build_engine_config,
    build_space,
)
from simcore.cost.memory import (
    MemoryBreakdown,
    explain_reasons,
    memory_breakdown,
    reason_names,
    redundant_fit_error,
)
from simcore.cost.proxy import evaluate
from simcore.engine import simulate
from simcore.engine.trace import write_trace
from simcore.export import check_target, export_plan
from simcore.models import model_summary
from simcore.space.megatron import megatron_search
from simcore.strategy.sharding import Strategy, megatron_sharding
from topologies.scenario import build_context, build_graph

__all__ = ["run", "main", "SimAppConfig", "ShardSimConfig"]


_DEGREES = ("tp", "ep", "pp", "dp", "batch", "microbatches")
_SLO_REASONS = ("ttft_slo", "tpot_slo")  # judged on the simulated times: a verdict, not bad input


@dataclass
class ShardSimConfig(SimConfig):
    """``shard-sim``'s ``sim`` node: the engine's switches (:class:`simcore.engine.EngineConfig`) and
    ``allow_invalid``: price an invalid plan anyway, every figure marked INVALID (a what-if), instead of
    refusing it as bad input (one line, exit 2)."""

    allow_invalid: bool = False


@dataclass
class StrategyConfig:
    """A strategy typed on the command line (``strategy.tp=8 strategy.sharding.dense_ffn2=dim1``);
    refused beside ``plan`` (:mod:`planner.apps.unread`). A degree left null is 1 once any field is set; with none set
    (every degree null, Megatron's sharding, no replicas) the best Megatron plan is simulated."""

    tp: int | None = None
    ep: int | None = None
    pp: int | None = None
    dp: int | None = None
    batch: int | None = None
    microbatches: int | None = None
    sharding: dict[str, str] = field(default_factory=megatron_sharding)
    redundant_experts: int = 0


@dataclass
class SimAppConfig:
    """``shard-sim``'s config: the scenario groups, the ``sim`` switches, the plan to price (``plan``
    file or ``strategy.*``), ``export`` target, and ``planner``: the space bounds of the Megatron
    search run when neither ``plan`` nor ``strategy.*`` is given."""

    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    sim: ShardSimConfig = field(default_factory=ShardSimConfig)
    planner: SpaceConfig = field(default_factory=SpaceConfig)
    scenario: str = "custom"
    plan: str | None = None
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    export: str | None = None
    serving: ServingAppConfig = field(default_factory=ServingAppConfig)  # read when workload=serving


def _load(cfg: DictConfig) -> Strategy | None:
    """The plan file's or the command line's strategy; ``None`` when neither gives one."""
    if cfg.plan:
        plan = _plan_file(str(cfg.plan))
        if plan.get("model") not in (None, cfg.model.name):
            raise UserError(f"plan: made for model {plan['model']!r} (scenario {plan.get('scenario')!r}), "
                            f"the config has {cfg.model.name!r}; pass experiment={plan.get('scenario')} or model=...")
        return Strategy.from_yaml(str(cfg.plan))
    given = OmegaConf.to_container(cfg.strategy, resolve=True) or {}
    if all(given.get(d) is None for d in _DEGREES) and not given.get("redundant_experts") \
            and given.get("sharding") == megatron_sharding():
        return None
    return Strategy.from_dict({k: (1 if k in _DEGREES and v is None else v) for k, v in given.items()})


def _best_megatron(ctx, cfg: DictConfig) -> tuple[Strategy, str]:
    """The best valid Megatron plan of the scenario under the proxy, and the line that says so."""
    ranked = megatron_search(ctx, build_space(ctx, cfg.planner))
    best = ranked.strategy(0)
    if not ranked.num_valid:
        reasons = ", ".join(reason_names(int(ranked.result.reasons[ranked.order[0]])))
        raise UserError(f"strategy: no plan given and no Megatron plan of {ctx.model.name} is valid on "
                        f"{ctx.cluster.num_gpus} GPUs among {ranked.calls} degree combinations ({reasons}); "
                        "pass plan=... or strategy.*=...")
    line = (f"no plan given: simulating the best Megatron plan of {cfg.scenario} under the proxy "
            f"(Megatron's per-operator sharding; tp={best.tp} ep={best.ep} pp={best.pp} dp={best.dp} "
            f"batch={best.batch} microbatches={best.microbatches}, best of {ranked.num_valid} valid among "
            f"{ranked.calls} degree combinations); pass plan=... or strategy.*=... for another")
    return best, line


def _plan_file(path: str) -> dict:


    if not Path(path).is_file():
        raise UserError(f"plan: no such file {path}")
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"plan: not valid YAML: {str(exc).splitlines()[0]}") from None
    return data if isinstance(data, dict) else {}


def _breakdown_table(title: str, proxy, sim, invalid: bool) -> Table:
    """Proxy and simulator side by side: step, latency, throughput, and the split of one step; an
    ``invalid`` plan's throughput cells say INVALID."""
    table = Table(title=title)
    for col in ("", "proxy", "simulator", "sim / proxy"):
        table.add_column(col, justify="right" if col else "left")

    def row(name, a, b, unit=1e3, fmt="{:.3f}", mark=""):
        ratio = f"{b / a:.3f}" if a == a and b == b and a else "-"
        table.add_row(name, ("-" if a != a else fmt.format(a * unit)) + mark,
                      ("-" if b != b else fmt.format(b * unit)) + mark, ratio)

    row("step (ms)", proxy.step_time_s, sim.step_time_s)
    row("TTFT (ms)", proxy.ttft_s, sim.ttft_s)
    row("TPOT (ms)", proxy.tpot_s, sim.tpot_s)
    simulated = sim.step_time_s == sim.step_time_s  # a structurally invalid plan is not simulated
    row("tokens/s/GPU", proxy.tokens_per_s_per_gpu, sim.tokens_per_s_per_gpu if simulated else float("nan"), unit=1,
        fmt="{:,.1f}", mark=" INVALID" if invalid else "")
    comm = sum(v for k, v in proxy.by_category.items() if k.startswith("comm"))
    split = sim.split[-1] if sim.split else {}
    row("compute (ms, last stage)", proxy.by_category.get("compute", 0.0), split.get("compute", float("nan")))
    row("communication exposed (ms)", comm, split.get("exposed_comm", float("nan")))
    row("bubble + idle (ms)", proxy.by_category.get("bubble", 0.0),
        split.get("bubble", float("nan")) + split.get("idle", float("nan")))
    return table


def _memory_table(memory: MemoryBreakdown) -> Table:
    """The fullest GPU's HBM by part, its total, the capacity and the headroom left (GB, SI)."""
    table = Table(title="memory per GPU (fullest pipeline stage)")
    table.add_column("")
    table.add_column("GB", justify="right")
    table.add_column("of capacity", justify="right")
    rows = (("weights", memory.weights_bytes), ("KV cache", memory.kv_cache_bytes),
            ("activations", memory.activations_bytes),
            ("workspace (CUDA context, NCCL, allocator)", memory.workspace_bytes), ("total", memory.total_bytes),
            (f"capacity ({memory.gpu})", memory.capacity_bytes), ("headroom", memory.headroom_bytes))
    for name, value in rows:
        over = " OVER" if name == "headroom" and value < 0 else ""
        table.add_row(name, f"{value / 1e9:.2f}{over}", f"{value / memory.capacity_bytes:.1%}")
    return table


def _print_comparison(cfg, ctx, strategy, proxy, sim, memory: MemoryBreakdown) -> None:
    """The proxy's and the simulator's step side by side, the memory, the proxy's operators, and each
    verdict; an invalid plan's tables say INVALID in their titles and throughput cells."""
    con = console()
    reasons = list(dict.fromkeys(proxy.reasons + sim.reasons))
    mark = f"INVALID ({', '.join(reasons)}) what-if: " if reasons else ""
    con.print(_breakdown_table(f"{mark}{cfg.scenario}: {ctx.model.name} on {ctx.cluster.num_gpus} x "
                               f"{ctx.cluster.gpu.name}, {ctx.workload.phase}, tp={strategy.tp} ep={strategy.ep} "
                               f"pp={strategy.pp} dp={strategy.dp} batch={strategy.batch} "
                               f"mb={strategy.microbatches}", proxy, sim, bool(reasons)))
    con.print(_memory_table(memory))
    ops = Table(title="proxy: one step by operator" + (" (INVALID plan)" if reasons else ""))
    ops.add_column("operator")
    ops.add_column("ms", justify="right")
    ops.add_column("share", justify="right")
    for name, value in sorted(proxy.by_operator.items(), key=lambda kv: -kv[1]):
        ops.add_row(name, f"{value * 1e3:.3f}", f"{value / proxy.step_time_s:.1%}")
    con.print(ops)
    for label, r in (("proxy", proxy), ("simulator", sim)):
        verdict = "valid" if r.valid else f"INVALID ({', '.join(r.reasons)})"
        con.print(f"{label}: {verdict}")


def _write_outputs(cfg, ctx, graph, engine, strategy, sim, payload: dict, out: Path) -> list[str]:
    """``result.json``, ``trace.json`` and, with ``export``, the launch command (also printed, plain, so
    it stays copy-pasteable); returns the names written."""
    written = []
    if cfg.export is not None:
        exported = export_plan(strategy, ctx.model, str(cfg.export), ctx=ctx, graph=graph, engine=engine,
                               plan_sim=sim.tokens_per_s_per_gpu)
        text = exported.to_text()
        print(text, end="", flush=True)
        atomic_write_text(out / f"export_{exported.target}.txt", text)
        payload["export"] = exported.to_dict()
        written.append(f"export_{exported.target}.txt")
    written.insert(0, atomic_write_json(out / "result.json", payload).name)
    if sim.trace is not None:
        write_trace(out / "trace.json", sim.trace)
        written.insert(1, "trace.json")
    return written


def _refuse_invalid(cfg, ctx, strategy, proxy) -> None:
    """Raise :class:`UserError` for a plan that cannot run (any reason but an SLO miss): one line naming
    each reason with its numbers (``hbm_capacity: 96.1 GB per GPU (weights 70.6, ...) > 85.5 GB on h100-sxm``)."""
    overflow = redundant_fit_error(ctx, strategy)
    if overflow:  # the replicas alone break the memory budget
        raise UserError(overflow)
    blocking = [r for r in proxy.reasons if r not in _SLO_REASONS]
    if not blocking:
        return
    line = "; ".join(explain_reasons(ctx, strategy, blocking))
    made_for = _plan_file(str(cfg.plan)).get("topology") if cfg.plan else None
    if "device_count" in blocking and isinstance(made_for, dict) \
            and made_for.get("num_nodes") not in (None, cfg.topology.num_nodes):
        line += f" (the plan was made for topology.num_nodes={made_for['num_nodes']})"
    raise UserError(f"strategy: {line}; sim.allow_invalid=true prices it anyway")


def run(cfg: DictConfig) -> dict:
    """Simulate the strategy beside the proxy, print both, write ``result.json`` and ``trace.json``
    (and, with ``export``, the target's launch command into ``export_<target>.txt``).
    ``workload=serving`` simulates one serving plan instead (:mod:`planner.apps.serve`)."""
    if is_serving(cfg):
        return run_serving_sim(cfg)
    if cfg.export is not None:
        check_target(str(cfg.export))
    strategy = _load(cfg)
    ctx = build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload, cfg.sim)
    source, note = ("plan" if cfg.plan else "command line"), None
    if strategy is None:
        strategy, note = _best_megatron(ctx, cfg)
        source = "best Megatron plan"
        console().print(note)
    proxy = evaluate(ctx, strategy)
    if not cfg.sim.allow_invalid:  # bad input: before any table or simulation
        _refuse_invalid(cfg, ctx, strategy, proxy)
    memory = memory_breakdown(ctx, strategy)
    graph = build_graph(cfg.topology, cfg.hardware)
    engine = build_engine_config(cfg.sim)
    engine.trace = True
    sim = simulate(ctx, graph, strategy, engine)
    _print_comparison(cfg, ctx, strategy, proxy, sim, memory)
    out = run_dir()
    reasons = list(dict.fromkeys(proxy.reasons + sim.reasons))
    payload = {"scenario": cfg.scenario, "strategy_source": source, "model": model_summary(ctx.model),
               "valid": not reasons, "invalid_reason": ";".join(reasons), "memory": memory.to_dict(),
               "proxy": proxy.to_dict(), "sim": sim.to_dict()}
    written = _write_outputs(cfg, ctx, graph, engine, strategy, sim, payload, out)
    if note:
        console().print(f"simulated: {source} of {cfg.scenario}")
    console().print(f"simulated in {sim.wall_s:.2f} s; wrote {', '.join(written)} into run dir: {out}")
    return payload


ConfigStore.instance().store(name="sim_schema", node=SimAppConfig)


@hydra.main(version_base=None, config_path="pkg://conf", config_name="sim")
@cli_errors
def _main(cfg: DictConfig) -> float:
    check_known_keys(cfg, SimAppConfig)
    check_typed_keys(cfg, typed_keys(), "shard-sim")
    payload = run(cfg)
    if "result" in payload:  # workload=serving
        metrics = payload["result"]["metrics"]
        return float(metrics["output_tokens_per_s_per_gpu"]) if metrics else 0.0
    return float(payload["sim"]["tokens_per_s_per_gpu"]) if payload["valid"] else 0.0  # a sweep ranks no invalid plan


main = config_errors_exit_2(_main)
