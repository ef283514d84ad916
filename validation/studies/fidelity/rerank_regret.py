"""Re-ranking regret: does re-ranking the proxy's top 16 find the simulator's best plan?

``python -m validation.studies.fidelity.rerank_regret`` takes, per benchmark scenario, the proxy's ``--pool`` (200)
best distinct plans, exactly (:func:`planner.topk.top_k`), simulates every one of them, and reports

- **before**: ``1 - sim(pick) / sim(best of the pool)`` where ``pick`` is the simulator's best among
  the proxy's top ``--k`` (16), what ``shard-search`` answers with ``planner.reranker=sim``;
- **after**: the same for the simulator-in-the-loop pick (:func:`planner.simloop.sim_in_the_loop`,
  ``--budget`` simulations at most, chosen by a correction of the proxy learned on the simulated
  plans), with the number of simulations it asked for.

Simulated plans are memoized on disk, ``OUT/<scenario>/sims.jsonl`` (``--out``, default
``outputs/rerank_regret``), tagged with a fingerprint of the scenario's config, so a second run (or
another budget) simulates nothing again. One process, one thread. ``--max-wall-s`` (900) bounds the
time spent simulating one scenario's pool (the 1024-GPU scenarios take seconds to minutes per plan):
past it the rest of the pool is left unsimulated, and the table says which sim/proxy ratio an
unsimulated plan would need to change the answer against the largest ratio seen. ``--set`` applies
Hydra overrides to every scenario. Prints a table per scenario and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from planner.apps.common import atomic_write_text
from planner.megatron import strategy_from_key
from planner.simloop import SimMemo, plan_features, scenario_fingerprint, sim_in_the_loop
from planner.topk import top_k
from simcore.config import build_engine_config, build_space
from simcore.cost.proxy import evaluate
from simcore.engine import simulate
from simcore.files import dumps
from topologies.scenario import build_context, build_graph
from validation.studies.common.scenarios import scenario_config, scenario_context

__all__ = ["SCENARIOS", "MORE", "TARGET", "regret", "run_scenario", "main"]

SCENARIOS = ("dense-70b-1node", "dense-70b-prefill", "mixtral-2node", "deepseek-8node", "gptmoe-1.6t-16k")
MORE = ("gptmoe-1.6t-32k", "gptmoe-1.6t-64k")
TARGET = 0.02  # regret above this needs the simulator in the loop


def regret(pick_value: float, best_value: float) -> float:
    """``1 - pick / best`` (0 when the pick is the best; 1 when nothing valid was picked)."""
    if not best_value > 0:
        return float("nan")
    return 1.0 - (pick_value if pick_value > 0 else 0.0) / best_value


def _fingerprint(cfg) -> str:
    return scenario_fingerprint(OmegaConf.to_container(cfg, resolve=True))


def _simulator(ctx, cfg):
    graph, engine = build_graph(cfg.topology, cfg.hardware), build_engine_config(cfg.sim)

    def one(key: tuple) -> tuple[float, bool]:
        res = simulate(ctx, graph, strategy_from_key(key), engine)
        return float(res.tokens_per_s_per_gpu), bool(res.valid)

    return one


def run_scenario(name: str, pool: int, k: int, budget: int, out: Path, verbose: bool = True,
                 overrides: tuple[str, ...] = (), max_wall_s: float = float("inf")) -> dict:
    """Top-``pool`` by the proxy, all simulated (memoized under ``out``), regret before and after;
    ``overrides``: Hydra overrides on the scenario (``topology.oversubscription=2``); past ``max_wall_s``
    the rest of the pool is left unsimulated and the bound it would have to beat is reported."""
    cfg = scenario_config(name, list(overrides))
    ctx = build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload, cfg.sim) if overrides else \
        scenario_context(name)
    started = time.perf_counter()
    top = top_k(ctx, build_space(ctx, cfg.planner), pool)
    topk_s = time.perf_counter() - started
    proxies = [evaluate(ctx, strategy_from_key(key)) for key in top.keys]
    features = np.array([plan_features(key, p.by_category, p.step_time_s) for key, p in zip(top.keys, proxies,
                                                                                           strict=True)])
    memo = SimMemo(_simulator(ctx, cfg), out / name / "sims.jsonl", _fingerprint(cfg))  # tagged by config
    sim = np.full(len(top.keys), np.nan)  # NaN: not simulated (the wall limit came first)
    for i, key in enumerate(top.keys):
        if time.perf_counter() - started > max_wall_s and tuple(int(v) for v in key) not in memo.cache:
            continue  # cached plans are still read: a later run with more time goes further
        value, valid = memo(key)
        sim[i] = value if valid else 0.0
        if verbose and (i + 1) % 25 == 0:
            print(f"  {name}: simulated {i + 1}/{len(top.keys)} ({time.perf_counter() - started:.0f} s)", flush=True)
    done = np.isfinite(sim)
    asked: list[tuple] = []

    def counted(key: tuple) -> tuple[float, bool]:
        asked.append(key)
        return memo(key)

    loop = sim_in_the_loop(top.keys, top.values, features, counted, budget=budget, seed=k)
    for i in loop.simulated:  # the loop's own simulations count as ground truth too
        sim[i] = loop.sim_values[i]
    done = np.isfinite(sim)
    score = np.where(done, sim, -np.inf)
    best = int(np.argmax(score))
    before = int(np.argmax(score[:k]))
    after = loop.best if loop.best is not None else before
    ratios = sim[done & (sim > 0)] / top.values[done & (sim > 0)]
    # an unsimulated plan changes the best only if its sim/proxy ratio beats best sim / its proxy value
    need = float(sim[best] / top.values[~done].max()) if (~done).any() else None
    return {"scenario": name + "".join(f" {o}" for o in overrides), "gpus": int(ctx.cluster.num_gpus), "pool": int(len(top.keys)), "k": k,
            "proxy_best": float(top.values[0]), "proxy_pool_last": float(top.values[-1]),
            "sim_best": float(sim[best]), "sim_best_proxy_rank": best + 1, "sim_best_plan": _plan(top.keys[best]),
            "pick_before": _plan(top.keys[before]), "sim_pick_before": float(sim[before]),
            "pick_before_proxy_rank": before + 1, "regret_before": regret(sim[before], sim[best]),
            "pick_after": _plan(top.keys[after]), "sim_pick_after": float(sim[after]),
            "pick_after_proxy_rank": after + 1, "regret_after": regret(sim[after], sim[best]),
            "sims_after": len(asked), "rounds_after": loop.rounds, "correction_rmse": loop.rmse,
            "simulated": int(done.sum()), "sim_over_proxy_median": float(np.median(ratios)) if len(ratios) else None,
            "sim_over_proxy_max": float(ratios.max()) if len(ratios) else None, "ratio_needed_by_unsimulated": need,
            "topk_s": topk_s, "wall_s": time.perf_counter() - started, "cache_hits": memo.hits,
            "simulated_now": memo.misses}


def _plan(key) -> str:
    tp, ep, pp, dp, batch, mb = (int(v) for v in key[:6])
    return f"tp{tp} ep{ep} pp{pp} dp{dp} b{batch} mb{mb}"


def _print(r: dict) -> None:
    print(f"\n{r['scenario']} ({r['gpus']} GPUs): proxy top {r['pool']} spans {r['proxy_best']:,.1f} .. "
          f"{r['proxy_pool_last']:,.1f} tokens/s/GPU; median sim/proxy {r['sim_over_proxy_median']:.3f}")
    print(f"  {'':28s} {'plan':34s} {'proxy #':>7s} {'sim tok/s/GPU':>14s} {'regret':>7s} {'sims':>5s}")
    print(f"  {'simulator best of the pool':28s} {r['sim_best_plan']:34s} {r['sim_best_proxy_rank']:7d} "
          f"{r['sim_best']:14,.1f} {'':>7s} {r['pool']:5d}")
    label = f"before: re-rank top {r['k']}"
    print(f"  {label:28s} {r['pick_before']:34s} {r['pick_before_proxy_rank']:7d} "
          f"{r['sim_pick_before']:14,.1f} {r['regret_before']:7.2%} {r['k']:5d}")
    print(f"  {'after: simulator in the loop':28s} {r['pick_after']:34s} {r['pick_after_proxy_rank']:7d} "
          f"{r['sim_pick_after']:14,.1f} {r['regret_after']:7.2%} {r['sims_after']:5d}")
    print(f"  ({r['wall_s']:.0f} s, {r['simulated_now']} simulated now, {r['cache_hits']} from the cache)")
    if r["simulated"] < r["pool"]:
        print(f"  only {r['simulated']} of {r['pool']} simulated (wall limit): an unsimulated plan could change the "
              f"best only with sim/proxy above {r['ratio_needed_by_unsimulated']:.3f}; simulated plans reach at most "
              f"{r['sim_over_proxy_max']:.3f}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma separated (default the five benchmarks; also {', '.join(MORE)})")
    parser.add_argument("--pool", type=int, default=200, help="the proxy's top plans simulated (200)")
    parser.add_argument("--k", type=int, default=16, help="re-ranked by shard-search (16)")
    parser.add_argument("--budget", type=int, default=48, help="simulations of the in-the-loop re-ranker (48)")
    parser.add_argument("--out", default="outputs/rerank_regret", help="run dir (the simulation cache)")
    parser.add_argument("--max-wall-s", type=float, default=900.0,
                        help="per scenario: stop simulating the pool after this long (900; cached plans still count)")
    parser.add_argument("--set", action="append", default=[], metavar="OVERRIDE",
                        help="Hydra override applied to every scenario, e.g. topology.oversubscription=2")
    args = parser.parse_args(argv)
    for field in ("pool", "k", "budget"):
        if getattr(args, field) < 1:
            parser.error(f"--{field} must be >= 1, got {getattr(args, field)}")
    rows = []
    for name in [n for n in args.scenarios.split(",") if n]:
        rows.append(run_scenario(name, args.pool, args.k, args.budget, Path(args.out), overrides=tuple(args.set),
                                 max_wall_s=args.max_wall_s))
        _print(rows[-1])
        atomic_write_text(Path(args.out) / "rows.json", json.dumps(rows, indent=1))  # each scenario as it ends
    headline = {"target": TARGET, "pool": args.pool, "k": args.k, "budget": args.budget, "set": args.set,
                "regret_before": {r["scenario"]: round(r["regret_before"], 4) for r in rows},
                "regret_after": {r["scenario"]: round(r["regret_after"], 4) for r in rows},
                "sims_after": {r["scenario"]: r["sims_after"] for r in rows},
                "simulated_of_pool": {r["scenario"]: r["simulated"] for r in rows},
                "above_target_before": [r["scenario"] for r in rows if r["regret_before"] > TARGET],
                "above_target_after": [r["scenario"] for r in rows if r["regret_after"] > TARGET]}
    print(dumps(headline))
    return headline


if __name__ == "__main__":
    main()
