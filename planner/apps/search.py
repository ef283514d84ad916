"""``shard-search``: find the best sharding for the configured scenario (PPO by default).

A thin Hydra entry point over :func:`run`, which is pure: config in, files in the run dir out.
``planner=ppo|random|random-walk|annealing|genetic|megatron|exact`` picks the method,
``planner.budget=N`` and ``seed=N`` its budget and seed; ``+resume=RUN_DIR`` continues an interrupted
run in ``RUN_DIR`` (SIGINT/SIGTERM stop a run cleanly after saving).

Writes ``results.json`` and ``summary.json``, ``best_plan.yaml`` (replay with ``shard-sim plan=...``),
``candidates.csv`` (every evaluated strategy), ``search_curve.png`` and, for PPO, ``metrics.jsonl``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import numpy as np
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from planner.apps.common import (
    atomic_write_json,
    atomic_write_text,
    check_known_keys,
    cli_errors,
    config_errors_exit_2,
    console,
    run_dir,
    typed_keys,
)
from planner.apps.outputs import plot_curve, rerank_table, write_candidates, write_metrics
from planner.apps.serving_search import run_serving_search
from planner.apps.unread import check_typed_keys
from planner.checkpoint import StopRequest
from planner.config import PlannerBaseConfig, check_planner
from planner.config import register as register_planners
from planner.exact import exact_optimum
from planner.megatron import megatron_search, strategy_from_key
from planner.rerank import best_valid, make_reranker, rerank_search
from planner.runner import ITERATIVE, SearchInterrupted, SearchResult, run_planner
from planner.serving.config import ServingAppConfig, is_serving
from planner.simloop import rerank_search_loop, scenario_fingerprint
from simcore.config import (
    ConfigError,
    HardwareConfig,
    ModelConfig,
    SimConfig,
    TopologyConfig,
    WorkloadConfig,
    build_engine_config,
    build_space,
)
from simcore.cost.proxy import evaluate
from simcore.models import model_summary
from simcore.strategy.opgraph import SEARCHABLE_OPS, op_applies
from topologies.scenario import build_context, build_graph

__all__ = ["SearchAppConfig", "register", "run", "main"]


@dataclass
class SearchAppConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    planner: PlannerBaseConfig = field(default_factory=PlannerBaseConfig)  # each option extends it (planner.config)
    sim: SimConfig = field(default_factory=SimConfig)
    serving: ServingAppConfig = field(default_factory=ServingAppConfig)  # read when workload=serving
    scenario: str = "custom"
    seed: int = 0


def register() -> None:
    ConfigStore.instance().store(name="search_schema", node=SearchAppConfig)
    register_planners()  # planner/<option>_schema, which conf/planner/<option>.yaml extends


def _search(ctx, space, cfg, out: Path, config: dict, resume: bool) -> SearchResult:
    """Run the planner under a progress bar (best so far, candidates/s) and a stop request."""
    import torch

    torch.set_num_threads(1)  # tiny network: one thread is fastest and bit-reproducible
    p = cfg.planner
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}"), TextColumn("{task.fields[rate]} cand/s"), TimeElapsedColumn())
    with StopRequest() as stop, Progress(*columns, console=console()) as progress:
        task = progress.add_task(f"{p.name} on {cfg.scenario}", total=int(p.budget) if p.name in ITERATIVE else None,
                                 best="-", rate="-")
        started = time.perf_counter()

        def listener(ev) -> None:
            best = f"{ev.best_value:,.1f}" if ev.best_key is not None else "-"
            rate = ev.calls / max(time.perf_counter() - started, 1e-9)
            progress.update(task, completed=ev.calls, best=best, rate=f"{rate:,.0f}")

        try:
            return run_planner(ctx, space, p, int(cfg.seed), run_dir=out, config=config, resume=resume, stop=stop,
                               listener=listener)
        except SearchInterrupted as exc:
            exc.signal = stop.signal
            raise


def _references(ctx, space, cfg, result: SearchResult) -> tuple[float | None, float | None]:
    """Proxy throughput of the Megatron heuristic and of the exact optimum (for the curve and table)."""
    if result.planner == "megatron":
        megatron = result.best_value
    else:
        ranked = megatron_search(ctx, space)
        megatron = float(ranked.result.tokens_per_s_per_gpu[ranked.order[0]]) if ranked.num_valid else None
    exact = None
    if result.planner == "exact":
        exact = result.best_value
    elif cfg.planner.reference_lines:
        try:
            exact = exact_optimum(ctx, space).tokens_per_s_per_gpu
        except ValueError:  # a static workload too large for brute force: no exact line
            exact = None
    return megatron, exact


def run(cfg: DictConfig) -> dict:
    """Search, re-rank, print the tables, write every output; return the summary.
    ``workload=serving`` searches serving plans instead (:mod:`planner.serving`)."""
    seed = cfg.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:  # numpy's and torch's generators' seeds
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
    if is_serving(cfg):

        return run_serving_search(cfg)
    check_planner(cfg.planner)
    resume_dir = cfg.get("resume")
    out = Path(resume_dir) if resume_dir else run_dir()
    config = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "resume"}
    ctx = build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload, cfg.sim)
    space = build_space(ctx, cfg.planner)
    con = console()
    result = _search(ctx, space, cfg, out, config, resume=bool(resume_dir))
    started = time.perf_counter()
    graph = build_graph(cfg.topology, cfg.hardware) if cfg.planner.reranker == "sim" else None
    reranker = make_reranker(ctx, cfg.planner.reranker, graph, build_engine_config(cfg.sim))
    if cfg.planner.rerank_pool > 0:  # the simulator in the loop (planner/simloop.py), memoized in the run dir

        reranked = rerank_search_loop(ctx, result, int(cfg.planner.rerank_pool), int(cfg.planner.rerank_k),
                                      int(cfg.planner.rerank_budget), reranker, out / "sims.jsonl",
                                      scenario_fingerprint(config, cfg.planner.reranker))
    else:
        reranked = rerank_search(ctx, result, int(cfg.planner.rerank_k), reranker)
    rerank_s = time.perf_counter() - started
    megatron, exact = _references(ctx, space, cfg, result)
    ops = tuple(op for op in SEARCHABLE_OPS if op_applies(ctx.model, op))
    if reranked:
        con.print(rerank_table(reranked, ops, cfg.planner.reranker,
                               f"{cfg.scenario}: {result.planner}, {result.calls} calls, proxy vs "
                               f"{cfg.planner.reranker} ranking"))
    best = best_valid(reranked)  # an invalid plan is never the answer
    if best is not None:
        answer = evaluate(ctx, best.strategy)
    else:  # the closest candidate, reported as invalid: no best_plan.yaml
        score = np.where(np.isnan(result.values), -np.inf, result.values)
        closest = reranked[0] if reranked else None
        answer = evaluate(ctx, closest.strategy if closest else strategy_from_key(result.keys[int(np.argmax(score))]))
        answer.valid, answer.reasons = False, (closest.reasons if closest else answer.reasons) or answer.reasons
        con.print(f"[red]no valid strategy[/red]; best candidate fails: {', '.join(answer.reasons)} "
                  "(no best_plan.yaml written)")
    summary = _summary(cfg, result, answer, reranked, best, megatron, exact, rerank_s)
    _write(out, cfg, result, answer, reranked, summary, megatron, exact)
    if answer.valid:
        refs = [f"{answer.tokens_per_s_per_gpu / megatron:.3f}x Megatron" if megatron else "",
                f"{answer.tokens_per_s_per_gpu / exact:.4f} of exact" if exact else ""]
        vs = ", ".join(r for r in refs if r)
        sim = f", simulator {best.tokens_per_s_per_gpu:,.1f}" if cfg.planner.reranker == "sim" else ""
        con.print(f"best: {answer.tokens_per_s_per_gpu:,.1f} tokens/s/GPU proxy{sim}" + (f" ({vs})" if vs else "")
                  + f"  ->  run dir: {out}")
    else:
        con.print(f"run dir: {out}")
    return summary


def _summary(cfg, result: SearchResult, answer, reranked, best, megatron, exact, rerank_s: float) -> dict:
    sim = cfg.planner.reranker == "sim"
    value = best.tokens_per_s_per_gpu if best is not None else None
    proxy = answer.tokens_per_s_per_gpu if answer.valid else None
    return {
        "scenario": cfg.scenario, "planner": result.planner, "seed": int(cfg.seed), "calls": result.calls,
        "proxy_evals": result.proxy_evals, "valid": int((result.reasons == 0).sum()), "wall_s": result.wall_s,
        "rerank_wall_s": rerank_s, "reranker": cfg.planner.reranker, "rerank_k": len(reranked),
        "proxy_tokens_per_s_per_gpu": proxy, "reranked_tokens_per_s_per_gpu": value,
        "sim_tokens_per_s_per_gpu": value if sim else None,
        "search_best_proxy_tokens_per_s_per_gpu": None if result.best_key is None else result.best_value,
        "megatron_tokens_per_s_per_gpu": megatron, "exact_tokens_per_s_per_gpu": exact,
        "ratio_to_megatron": proxy / megatron if proxy and megatron else None,
        "fraction_of_exact": proxy / exact if proxy and exact else None,
        "strategy": answer.strategy.to_dict(), "model": model_summary(cfg.model.name),
    }


def _write(out: Path, cfg, result, answer, reranked, summary, megatron, exact) -> None:
    results = {**summary, "best": answer.to_dict(), "config": OmegaConf.to_container(cfg, resolve=True),
               "top": [{"strategy": r.strategy.to_dict(), "proxy_rank": r.proxy_rank, "valid": r.valid,
                        "invalid_reason": ";".join(r.reasons), "rank": r.rank if r.valid else None,
                        "proxy_tokens_per_s_per_gpu": r.proxy_tokens_per_s_per_gpu if r.valid else None,
                        "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu if r.valid else None} for r in reranked]}
    atomic_write_json(out / "results.json", results)
    atomic_write_json(out / "summary.json", summary)
    plan = {"scenario": cfg.scenario, "model": cfg.model.name, "topology": OmegaConf.to_container(cfg.topology),
            "workload": OmegaConf.to_container(cfg.workload), "strategy": answer.strategy.to_dict()}
    if answer.valid:  # only a valid plan is a plan to replay
        atomic_write_text(out / "best_plan.yaml", yaml.safe_dump(plan, sort_keys=False))
    write_candidates(out / "candidates.csv", result)
    if result.metrics:
        write_metrics(out / "metrics.jsonl", result.metrics)
    plot_curve(out / "search_curve.png", result, f"{cfg.scenario}: {result.planner}, seed {cfg.seed}", megatron, exact)


register()


@hydra.main(version_base=None, config_path="pkg://conf", config_name="search")
@cli_errors
def _main(cfg: DictConfig) -> float:
    check_known_keys(cfg, SearchAppConfig, extra=("resume",))
    check_typed_keys(cfg, typed_keys(), "shard-search")
    try:
        summary = run(cfg)
    except SearchInterrupted as exc:
        where = exc.run_dir or "the run dir"
        unit = getattr(exc, "unit", "chunk(s)")
        print(f"interrupted: {exc.chunks_done} {unit} saved in {where}; continue with +resume={where}",
              file=sys.stderr)
        sys.exit(128 + int(getattr(exc, "signal", None) or 2))
    value = summary["tokens_per_s_per_gpu"] if is_serving(cfg) else summary["proxy_tokens_per_s_per_gpu"]
    return float(value or 0.0)


main = config_errors_exit_2(_main)
