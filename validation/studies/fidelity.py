"""Fidelity study: does the roofline proxy rank strategies as the simulator does, and where not, why?

``run(out_dir, scenarios, strategies=500, seed=0, quick=False)``. For each benchmark scenario it
samples proxy-valid strategies (:mod:`.fidelity_sample`: the Megatron heuristic's best, the PPO
planner's search trajectory, random valid ones), prices each with the proxy and with the simulator
(contention and overlap on, the scenario's ``sim`` settings otherwise), and reports

- Kendall tau and Spearman rho of the two tokens/s/GPU rankings (also over the proxy's top 50),
  and the overlap of their top 10;
- the sim/proxy step-time ratio by regime (:mod:`.fidelity_regimes`);
- re-ranking: the simulator's best valid strategy among the proxy's top ``K = 16``, against the proxy's
  own pick, over the whole sample and over each source alone;
- every large disagreement (``|ratio - 1| > 5%``) explained from the simulator's breakdown of its
  critical stage against the proxy's (:mod:`.fidelity_explain`); the ``explain_top`` largest per
  scenario are simulated once more with contention off, to split overlap from link sharing.

Scenarios on ``LARGE_GPUS`` GPUs or more (the 1024-GPU GPT-MoE ones take seconds per simulation) get
``large_strategies`` strategies instead. ``python -m validation.studies.fidelity [--quick]
[--scenarios a b] [--strategies N] [--out DIR]`` ends with one JSON line of the headline figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from planner.megatron import strategy_from_key
from simcore.proxy import evaluate
from validation.scenarios import scenario_context
from validation.studies.fidelity_explain import (
    critical_split,
    deltas,
    dominant_cause,
    explain,
    overlap_contention_why,
)
from validation.studies.fidelity_regimes import classify, collective_profile, primary
from validation.studies.fidelity_sample import sample_strategies

__all__ = ["DEFAULT_SCENARIOS", "QUICK", "LARGE_GPUS", "K_RERANK", "LARGE", "simulate_keys", "run", "main"]

DEFAULT_SCENARIOS = ("dense-70b-1node", "dense-70b-prefill", "mixtral-2node", "deepseek-8node", "gptmoe-1.6t-16k")
LARGE_GPUS = 512
K_RERANK = 16
LARGE = 0.05  # a large disagreement: |sim/proxy step ratio - 1| above this
QUICK = {"scenarios": ("dense-70b-1node",), "strategies": 12, "large_strategies": 6, "search_budget": 4,
         "workers": 1, "explain_top": 2}
FULL = {"scenarios": DEFAULT_SCENARIOS, "strategies": 500, "large_strategies": 60, "search_budget": 200,
        "workers": 2, "explain_top": 6}


@functools.cache
def _setup(name: str, contention: bool):
    """Context, topology graph and engine config of a scenario (cached per process)."""
    from simcore.config import build_engine_config, build_graph
    from validation.scenarios import scenario_config

    cfg = scenario_config(name)
    engine = dataclasses.replace(build_engine_config(cfg.sim), contention=contention, overlap=True, trace=False)
    return scenario_context(name), build_graph(cfg.topology, cfg.hardware), engine


def _simulate_one(args: tuple[str, tuple, bool]) -> dict:
    """One simulation, reduced to what the study keeps. A simulator exception is kept as ``error``
    (the study goes on; the report lists the strategy)."""
    from simcore.engine import simulate

    name, key, contention = args
    ctx, graph, engine = _setup(name, contention)
    start = time.perf_counter()
    try:
        res = simulate(ctx, graph, strategy_from_key(key), engine)
    except Exception as exc:  # any engine failure becomes a reported row, the study goes on
        nan = float("nan")
        return {"step_time_s": nan, "tokens_per_s_per_gpu": nan, "valid": False, "reasons": [],
                "split": [], "max_link_utilization": 0.0, "busiest_link": "",
                "wall_s": time.perf_counter() - start, "error": _error_text(exc)}
    util = sorted(res.link_utilization.items(), key=lambda kv: -kv[1])
    return {"step_time_s": res.step_time_s, "tokens_per_s_per_gpu": res.tokens_per_s_per_gpu, "valid": res.valid,
            "reasons": list(res.reasons), "split": list(res.split),
            "max_link_utilization": util[0][1] if util else 0.0, "busiest_link": util[0][0] if util else "",
            "wall_s": res.wall_s, "error": ""}


def _error_text(exc: Exception) -> str:
    """First line of an exception, without object addresses (stable across runs)."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return re.sub(r" (object )?at 0x[0-9a-f]+", "", text)


def simulate_keys(name: str, keys: np.ndarray, workers: int = 1, contention: bool = True) -> list[dict]:
    """Simulate every key of scenario ``name`` (in order), on ``workers`` processes."""
    jobs = [(name, tuple(int(v) for v in k), contention) for k in keys]
    if workers <= 1 or len(jobs) < 2:
        return [_simulate_one(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_simulate_one, jobs, chunksize=1))


def _sharding(strategy) -> str:
    from simcore.strategy import megatron_sharding

    base = megatron_sharding()
    return ";".join(f"{op}={c}" for op, c in strategy.sharding.items() if c != base[op]) or "megatron"


def _row(name, key, source, proxy, sim, profile_row) -> dict:
    s = proxy.strategy
    flags = classify(proxy.by_category, proxy.step_time_s, profile_row["latency_share"],
                     {g: profile_row[f"spans_{g}"] for g in ("tp", "ep", "pp")})
    # the simulator's split of the stage the proxy's breakdown is of, so the parts compare like for like
    stage = int(profile_row["critical_stage"])
    split = sim["split"][stage] if stage < len(sim["split"]) else critical_split(sim["split"])
    ratio = sim["step_time_s"] / proxy.step_time_s
    d = deltas(proxy.by_category, split)
    big = not sim["error"] and abs(ratio - 1) > LARGE
    comm = sum(v for k, v in proxy.by_category.items() if k.startswith("comm"))
    ms = {f"proxy_{k}_ms": v * 1e3 for k, v in (("compute", proxy.by_category.get("compute", 0.0)),
                                                 ("comm", comm), ("bubble", proxy.by_category.get("bubble", 0.0)))}
    ms |= {f"sim_{k}_ms": v * 1e3 for k, v in split.items()}
    return {"scenario": name, "source": source, "key": "-".join(map(str, key)), "tp": s.tp, "ep": s.ep, "pp": s.pp,
            "dp": s.dp, "batch": s.batch, "microbatches": s.microbatches, "sharding": _sharding(s),
            "proxy_tokens_per_s_per_gpu": proxy.tokens_per_s_per_gpu,
            "sim_tokens_per_s_per_gpu": sim["tokens_per_s_per_gpu"], "proxy_step_ms": proxy.step_time_s * 1e3,
            "sim_step_ms": sim["step_time_s"] * 1e3, "ratio": ratio, "sim_valid": sim["valid"],
            "sim_reasons": "|".join(sim["reasons"]), "regime": primary(flags), "regimes": "|".join(flags),
            "latency_share": float(profile_row["latency_share"]), "stage": stage, **ms,
            "max_link_utilization": sim["max_link_utilization"], "busiest_link": sim["busiest_link"],
            "large": big, "cause": dominant_cause(d) if big else "",
            "why": explain(proxy.by_category, split, sim["max_link_utilization"]) if big else "",
            "overlap_only_ratio": "", "overlap_vs_contention": "", "sim_wall_s": sim["wall_s"],
            "sim_error": sim["error"]}


def _scenario(name: str, n: int, seed: int, search_budget: int, workers: int, explain_top: int) -> list[dict]:
    """Sample, price and simulate one scenario; the rows of ``strategies.csv``."""
    ctx = scenario_context(name)
    start = time.perf_counter()
    keys, sources, note = sample_strategies(ctx, n, seed, search_budget)
    print(f"{name}: {len(keys)} strategies ({', '.join(f'{s} {sources.count(s)}' for s in dict.fromkeys(sources))})"
          f"; trajectory: {note}", flush=True)
    proxies = [evaluate(ctx, strategy_from_key(k)) for k in keys]
    profile = collective_profile(ctx, keys)
    sims = simulate_keys(name, keys, workers)
    rows = [_row(name, tuple(k), src, p, s, {f: v[i] for f, v in profile.items()})
            for i, (k, src, p, s) in enumerate(zip(keys.tolist(), sources, proxies, sims, strict=True))]
    worst = sorted((i for i, r in enumerate(rows) if r["large"]), key=lambda i: -abs(rows[i]["ratio"] - 1))
    worst = worst[:explain_top]
    for i, ov in zip(worst, simulate_keys(name, keys[worst], workers, contention=False), strict=True):
        if ov["error"]:
            rows[i]["overlap_vs_contention"] = f"contention off failed: {ov['error']}"
            continue
        r_ov = ov["step_time_s"] / proxies[i].step_time_s
        rows[i] |= {"overlap_only_ratio": r_ov, "overlap_vs_contention": overlap_contention_why(r_ov, rows[i]["ratio"])}
    wall = time.perf_counter() - start
    for r in rows:
        r["trajectory"] = note
        r["scenario_wall_s"] = wall
    print(f"{name}: simulated in {wall:.0f} s", flush=True)
    return rows


def _settings(quick: bool, given: dict) -> dict:
    base = dict(QUICK if quick else FULL)
    return base | {k: v for k, v in given.items() if v is not None}


def run(out_dir: str | Path, scenarios: tuple[str, ...] | list[str] | None = None, strategies: int | None = None,
        seed: int = 0, quick: bool = False, large_strategies: int | None = None, search_budget: int | None = None,
        workers: int | None = None, explain_top: int | None = None, measured: bool = True) -> dict:
    """Run the study, write its files into ``out_dir``, return the summary (``None`` = the quick or full
    default of that setting). ``measured``: also the three-way section against measurements
    (:mod:`.fidelity_measured`, on its first rows per file when ``quick``), ``headline["three_way"]``."""
    from validation.studies.fidelity_report import write_outputs

    opts = _settings(quick, {"scenarios": tuple(scenarios) if scenarios else None, "strategies": strategies,
                             "large_strategies": large_strategies, "search_budget": search_budget,
                             "workers": workers, "explain_top": explain_top})
    for field in ("strategies", "large_strategies", "workers"):
        if int(opts[field]) < 1:
            raise ValueError(f"{field} must be >= 1, got {opts[field]}")
    rows = []
    for name in opts["scenarios"]:
        large = scenario_context(name).cluster.num_gpus >= LARGE_GPUS
        n = min(opts["strategies"], opts["large_strategies"]) if large else opts["strategies"]
        rows += _scenario(name, int(n), seed, int(opts["search_budget"]), int(opts["workers"]),
                          int(opts["explain_top"]))
    summary = write_outputs(rows, Path(out_dir), opts | {"seed": seed, "quick": quick, "k_rerank": K_RERANK,
                                                         "large": LARGE, "large_gpus": LARGE_GPUS})
    if measured:
        from validation.studies import fidelity_measured

        summary["headline"]["three_way"] = fidelity_measured.run(out_dir, quick=quick)["headline"]
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small scenario, a dozen strategies")
    parser.add_argument("--scenarios", nargs="+", help="scenario names (space or comma separated)")
    parser.add_argument("--strategies", type=int, help="strategies per scenario (default 500)")
    parser.add_argument("--large-strategies", type=int, help=f"cap on scenarios of >= {LARGE_GPUS} GPUs (60)")
    parser.add_argument("--search-budget", type=int, help="PPO proposals for the trajectory (200)")
    parser.add_argument("--workers", type=int, help="simulation processes (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-measured", action="store_true", help="skip the three-way section")
    parser.add_argument("--out", default="outputs/fidelity", help="output directory")
    args = parser.parse_args(argv)
    names = [n for part in args.scenarios or [] for n in part.split(",") if n]
    summary = run(args.out, names or None, args.strategies, args.seed, args.quick, args.large_strategies,
                  args.search_budget, args.workers, measured=not args.no_measured)
    print(json.dumps(summary["headline"]))
    return summary


if __name__ == "__main__":
    main()
