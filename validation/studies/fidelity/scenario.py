"""One scenario of the fidelity study: sample, price, simulate and explain; the rows of ``strategies.csv``.

The strategies come from :mod:`.sample`, their regimes from :mod:`.regimes`, their simulations from
:mod:`.simulate`. Each row compares the proxy's critical stage with the simulator's split of the
same stage; a large disagreement (``|ratio - 1| > LARGE``) gets its dominant cause and a sentence
(:mod:`.explain`), and the ``explain_top`` largest are simulated once more with contention off, to
split overlap from link sharing.
"""

from __future__ import annotations

import time

from planner.megatron import strategy_from_key
from simcore.cost.proxy import evaluate
from simcore.strategy.sharding import megatron_sharding
from validation.studies.common.scenarios import scenario_context
from validation.studies.fidelity.explain import (
    critical_split,
    deltas,
    dominant_cause,
    explain,
    overlap_contention_why,
)
from validation.studies.fidelity.regimes import classify, collective_profile, primary
from validation.studies.fidelity.sample import sample_strategies
from validation.studies.fidelity.simulate import simulate_keys

__all__ = ["LARGE", "scenario_rows"]

LARGE = 0.05  # a large disagreement: |sim/proxy step ratio - 1| above this


def _sharding(strategy) -> str:
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


def scenario_rows(name: str, n: int, seed: int, search_budget: int, workers: int, explain_top: int) -> list[dict]:
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
