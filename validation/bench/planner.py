"""Every planner on the benchmark scenarios: fraction of the exact optimum, ratio to Megatron, wall time.

``python -m validation.bench.planner`` runs PPO (masked and unmasked), random search, random walk,
simulated annealing and the genetic algorithm on ``dense-70b-1node``, ``mixtral-2node``,
``deepseek-8node``, ``gptmoe-1.6t-16k`` and ``gptmoe-1.6t-32k``, 5 seeds each at 4000 proxy calls, with
the planner settings of ``conf/planner/*.yaml``. The top ``rerank_k`` distinct strategies of each
PPO run (``--rerank``: which methods) and of the Megatron heuristic are re-ranked by the simulator
(``planner.reranker``), so "x Megatron (re-ranked)" compares the two answers under the simulator.
The exact optimum and the Megatron heuristic are computed once per scenario. Prints one table and
the targets, then one line of JSON with every figure.

Options: ``--scenarios a,b``, ``--methods ppo,random``, ``--seeds 5``, ``--budget 4000``,
``--workers 2`` (processes; each search is single-threaded), ``--rerank ppo``.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from omegaconf import OmegaConf
from rich.table import Table

from planner.apps.common import console
from planner.config import PlannerConfig
from planner.rerank import make_reranker, rerank_search
from planner.runner import run_planner
from simcore.config import build_engine_config, build_space
from simcore.files import dumps
from topologies.scenario import build_graph
from validation.studies.common.scenarios import scenario_config, scenario_context

__all__ = ["main", "run_one", "METHODS", "SCENARIOS"]

SCENARIOS = ("dense-70b-1node", "mixtral-2node", "deepseek-8node", "gptmoe-1.6t-16k", "gptmoe-1.6t-32k")
METHODS = ("ppo", "ppo-unmasked", "random", "random-walk", "annealing", "genetic")
_OVERRIDES = {"ppo-unmasked": ["planner=ppo", "planner.masking=false"]}


def _planner_cfg(scenario: str, method: str, budget: int, extra: tuple[str, ...] = ()):
    overrides = _OVERRIDES.get(method, [f"planner={method}"]) + [f"planner.budget={budget}", *extra]
    cfg = scenario_config(scenario, overrides)
    return OmegaConf.to_object(cfg.planner)


_SIM_MEMO: dict = {}  # (scenario, reranker, strategy) -> re-ranked result, per worker process


def _rerank(scenario: str, ctx, result, pcfg) -> tuple[float, float]:
    """Re-ranked value of a search's answer and the re-ranking wall time. The re-ranker's answers
    are memoized per strategy: seeds and methods that reach the same plans do not simulate them twice."""
    started = time.perf_counter()
    graph = engine = None
    if pcfg.reranker == "sim":
        cfg = scenario_config(scenario)
        graph, engine = build_graph(cfg.topology, cfg.hardware), build_engine_config(cfg.sim)
    evaluate = make_reranker(ctx, pcfg.reranker, graph, engine)

    def memo(strategy):
        key = (scenario, pcfg.reranker, repr(strategy))
        if key not in _SIM_MEMO:
            _SIM_MEMO[key] = evaluate(strategy)
        return _SIM_MEMO[key]

    ranked = rerank_search(ctx, result, int(pcfg.rerank_k), memo)
    value = ranked[0].tokens_per_s_per_gpu if ranked and ranked[0].valid else float("nan")
    return value, time.perf_counter() - started


def run_one(job: tuple) -> dict:
    """One search (scenario, method, seed, budget, re-rank it?, planner overrides) and its figures."""
    scenario, method, seed, budget, with_rerank, extra = job
    ctx = scenario_context(scenario)
    pcfg = _planner_cfg(scenario, method, budget, extra)
    space = build_space(ctx, pcfg)  # the planner's space bounds, as shard-search builds them
    result = run_planner(ctx, space, pcfg, seed)
    reranked, rerank_s = _rerank(scenario, ctx, result, pcfg) if with_rerank else (float("nan"), 0.0)
    return {"scenario": scenario, "method": method, "seed": seed, "calls": result.calls,
            "proxy_evals": result.proxy_evals, "proxy": result.best_value, "reranked": reranked,
            "wall_s": result.wall_s, "rerank_s": rerank_s, "reranker": pcfg.reranker}


def _median(values) -> float:
    values = [v for v in values if v == v]
    return float(np.median(values)) if values else float("nan")


def _worst(values) -> float:
    values = [v for v in values if v == v]
    return float(min(values)) if values else float("nan")


def _summarize(runs: list[dict], refs: dict) -> dict:
    rows = {}
    for run in runs:
        rows.setdefault((run["scenario"], run["method"]), []).append(run)
    table = {}
    for (scenario, method), group in rows.items():
        ref = refs[scenario]
        frac = [r["proxy"] / ref["exact"] for r in group]
        table[f"{scenario}/{method}"] = {
            "scenario": scenario, "method": method, "seeds": len(group),
            "median_fraction_of_exact": _median(frac), "worst_fraction_of_exact": _worst(frac),
            "median_ratio_to_megatron_proxy": _median([r["proxy"] / ref["megatron"] for r in group]),
            "median_ratio_to_megatron_reranked": _median([r["reranked"] / ref["megatron_reranked"] for r in group]),
            "worst_ratio_to_megatron_reranked": _worst([r["reranked"] / ref["megatron_reranked"] for r in group]),
            "median_wall_s": _median([r["wall_s"] for r in group]),
            "max_search_and_rerank_s": float(max(r["wall_s"] + r["rerank_s"] for r in group)),
        }
    return table


def _references(scenario: str, budget: int, with_rerank: bool = True) -> dict:
    ctx = scenario_context(scenario)
    pcfg = _planner_cfg(scenario, "megatron", budget)
    space = build_space(ctx, pcfg)  # the planner's space bounds, as shard-search builds them
    started = time.perf_counter()
    exact = run_planner(ctx, space, PlannerConfig(name="exact"), 0)
    exact_s = time.perf_counter() - started
    megatron = run_planner(ctx, space, pcfg, 0)
    meg_reranked = _rerank(scenario, ctx, megatron, pcfg)[0] if with_rerank else float("nan")
    return {"exact": exact.best_value, "exact_wall_s": exact_s, "exact_calls": exact.calls,
            "megatron": megatron.best_value, "megatron_reranked": meg_reranked, "megatron_calls": megatron.calls,
            "reranker": pcfg.reranker}


def _print(table: dict, refs: dict, methods: list[str]) -> None:
    t = Table(title="planners vs the exact optimum and the Megatron heuristic (median over seeds)")
    for col in ("scenario", "method", "frac exact", "worst", "x Megatron (proxy)", "x Megatron (re-ranked)",
                "wall s"):
        t.add_column(col, justify="left" if col in ("scenario", "method") else "right")
    for scenario in refs:
        t.add_row(scenario, "exact", "1.0000", "1.0000", f"{refs[scenario]['exact'] / refs[scenario]['megatron']:.3f}",
                  "", f"{refs[scenario]['exact_wall_s']:.1f}")
        for method in methods:
            row = table.get(f"{scenario}/{method}")
            if row:
                t.add_row("", method, f"{row['median_fraction_of_exact']:.4f}", f"{row['worst_fraction_of_exact']:.4f}",
                          f"{row['median_ratio_to_megatron_proxy']:.3f}",
                          f"{row['median_ratio_to_megatron_reranked']:.3f}", f"{row['median_wall_s']:.1f}")
    console().print(t)


def _targets(table: dict, refs: dict, methods: list[str]) -> dict:
    """The issue's targets, each ``True``/``False`` (``None`` when not measured in this run)."""
    out = {}
    for scenario in refs:
        ppo = table.get(f"{scenario}/ppo")
        if not ppo:
            continue
        metas = [table[f"{scenario}/{m}"]["median_fraction_of_exact"] for m in methods
                 if m in ("random", "random-walk", "annealing", "genetic") and f"{scenario}/{m}" in table]
        out[scenario] = {
            "ppo_median_ge_0.99_exact": ppo["median_fraction_of_exact"] >= 0.99,
            "ppo_median_ge_every_metaheuristic": all(ppo["median_fraction_of_exact"] >= m - 1e-12 for m in metas)
            if metas else None,
            "reranked_ge_megatron": ppo["worst_ratio_to_megatron_reranked"] >= 1.0 - 1e-12,
        }
        if scenario == "deepseek-8node":
            out[scenario]["search_and_rerank_le_120_s"] = ppo["max_search_and_rerank_s"] <= 120.0
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rerank", default="ppo", help="methods whose answers the re-ranker re-ranks "
                        "(comma list, 'all' or 'none'; each costs up to rerank_k simulations per run)")
    parser.add_argument("--set", action="append", default=[], metavar="planner.KEY=VALUE",
                        help="a planner override for every method (repeatable), e.g. planner.elite_prior=2")
    args = parser.parse_args(argv)
    scenarios, methods = args.scenarios.split(","), args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    started = time.perf_counter()
    reranked = set(methods) if args.rerank == "all" else set() if args.rerank == "none" else set(args.rerank.split(","))
    refs = {s: _references(s, args.budget, bool(reranked & set(methods))) for s in scenarios}
    extra = tuple(args.set)
    jobs = [(s, m, seed, args.budget, m in reranked, extra)
            for s in scenarios for m in methods for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = list(pool.map(run_one, jobs))
    table = _summarize(runs, refs)
    _print(table, refs, methods)
    targets = _targets(table, refs, methods)
    for scenario, checks in targets.items():
        print(f"targets {scenario}: " + ", ".join(f"{k}={v}" for k, v in checks.items()))
    figures = {"bench": "planner", "budget": args.budget, "seeds": args.seeds, "overrides": list(extra),
               "references": refs, "table": table,
               "targets": targets, "runs": runs, "wall_s": time.perf_counter() - started}
    print(dumps(figures, default=float))
    return figures


if __name__ == "__main__":
    main()
