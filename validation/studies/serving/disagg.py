"""Disaggregated against aggregated serving: the best plan of each mode on the same cluster, SLOs and load.

Two cases, each searched twice with the same method and budget of simulations (aggregated plans only,
then disaggregated plans only; :func:`planner.serving.search_plans`), both answers simulated again at
more requests (``--confirm``) so the comparison does not rest on the search's shorter runs:

- ``deepseek-8node`` (256 clients) and ``deepseek-8node-c192`` (192): DeepSeek-V3 (FP8) on 8 nodes of
  H100 (``h100-ib-rail``, 64 GPUs), ISL 4096, OSL 512, mean TTFT <= 2 s and TPOT <= 50 ms, closed-loop
  clients: where the literature (DistServe; SGLang's and NVIDIA Dynamo's DeepSeek deployments) reports
  disaggregation winning. Served as those deployments serve it: SGLang with DeepEP's all-to-alls and
  DeepGEMM's grouped GEMMs (runtime ``sglang-deepep``); ``--runtime sglang`` prices the same case with
  SGLang's default Triton MoE kernels and NCCL all-to-alls;
- ``small-dense``: Llama-3.1-8B (FP8) on one HGX H100 node, vLLM, ISL 512, OSL 128, TTFT <= 500 ms,
  TPOT <= 20 ms, 8 clients: short prompts at low load, where one aggregated GPU serves everything and
  a split needs two pools.

Prints both plans per case, the winner and its margin (best tokens/s/GPU meeting the SLOs, disagg
over agg), and ends with one JSON line. ``python -m validation.studies.serving.disagg --cases small-dense``
runs one case; ``--budget``, ``--method``, ``--concurrency deepseek-8node=512`` change the search.
``--screen`` prints the pool-by-pool screening's first seeds of each case, screened against simulated.
``--modes agg --method exact`` searches one mode only (here: every aggregated plan, the mode's optimum).
``--methods-on CASE`` instead runs every search method on the case's joint space (both modes) at the
same budget over ``--seeds`` seeds and reports each one's fraction of the exact optimum. Every search
runs with the settings ``shard-search planner=<method>`` composes (``conf/planner/<method>.yaml``:
PPO's elite prior and five elite records, not the paper's defaults of the schema).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace

import numpy as np
from omegaconf import OmegaConf

from planner.serving import METHODS, search_plans
from planner.serving.config import ServingSearchConfig
from planner.serving.poolwise import screen_plans
from planner.serving.space import ServingSpace
from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.files import dumps
from simcore.models import get_model
from simcore.serving import RUNTIMES, LengthDist, ServingConfig, simulate_serving
from simcore.workload import Workload
from topologies import build_topology
from validation.studies.common.scenarios import planner_config

__all__ = ["CASES", "DEFAULT_CASES", "Case", "compare", "methods_table", "main"]


@dataclass(frozen=True)
class Case:
    model: str
    topology: str
    nodes: int
    runtime: str
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    concurrency: int
    requests_per_client: int = 8  # closed-loop clients all send at once: the first wave is 1/8 of the run
    max_num_seqs: tuple[int, ...] = (64, 128, 256, 512, 1024)


CASES = {
    "deepseek-8node": Case("deepseek-v3", "h100-ib-rail", 8, "sglang-deepep", 4096, 512, 2000.0, 50.0, 256),
    "deepseek-8node-c192": Case("deepseek-v3", "h100-ib-rail", 8, "sglang-deepep", 4096, 512, 2000.0, 50.0, 192),
    "small-dense": Case("llama-3.1-8b", "hgx-h100", 1, "vllm", 512, 128, 500.0, 20.0, 8,
                        max_num_seqs=(8, 16, 32, 64, 128)),
    # for --methods-on: a space whose optimum is neither the heuristic nor the smallest plan
    "dense-70b-1node": Case("llama-3.1-70b", "hgx-h100", 1, "vllm", 2048, 256, 1000.0, 30.0, 64, requests_per_client=4,
                            max_num_seqs=(16, 32, 64, 128)),
}
DEFAULT_CASES = ("deepseek-8node", "deepseek-8node-c192", "small-dense")
MODES = ("agg", "disagg")


def _scenario(case: Case, requests_per_client: int):
    graph = build_topology(case.topology, num_nodes=case.nodes)
    ctx = CostContext(get_model(case.model), Workload(precision="fp8", input_len=case.isl, output_len=case.osl),
                      Cluster.from_graph(graph))
    cfg = ServingConfig(concurrency=case.concurrency, num_requests=requests_per_client * case.concurrency,
                        input_len=LengthDist(mean=case.isl), output_len=LengthDist(mean=case.osl), runtime=case.runtime,
                        ttft_slo_s=case.ttft_ms / 1e3, tpot_slo_s=case.tpot_ms / 1e3)
    return ctx, cfg, graph


def _row(result) -> dict:
    m = result.metrics
    return {"plan": result.plan.describe(), "gpus": result.plan.gpus,
            "tokens_per_s_per_gpu": round(m.output_tokens_per_s_per_gpu, 2),
            "tokens_per_s_per_user": round(m.tokens_per_s_per_user, 2), "ttft_ms": round(m.ttft_s["mean"] * 1e3, 1),
            "tpot_ms": round(m.tpot_s["mean"] * 1e3, 2), "goodput": round(m.goodput, 3)}


def compare(name: str, case: Case, method: str, budget: int, seed: int, confirm: int,
            modes: tuple[str, ...] = MODES) -> dict:
    """Best plan of each mode, re-simulated at ``confirm`` requests per client; winner and margin (when
    both modes are searched)."""
    ctx, cfg, graph = _scenario(case, case.requests_per_client)
    _, long_cfg, _ = _scenario(case, confirm)
    out = {"case": name, "model": case.model, "gpus": ctx.cluster.num_gpus, "runtime": case.runtime,
           "concurrency": case.concurrency, "isl": case.isl, "osl": case.osl,
           "slo": {"ttft_ms": case.ttft_ms, "tpot_ms": case.tpot_ms}, "method": method, "budget": budget}
    for mode in modes:
        search = OmegaConf.structured(replace_search(budget, mode, case))
        started = time.perf_counter()
        ev, _ = search_plans(ctx, cfg, search, method, seed, graph=graph, pcfg=planner_config(method))
        wall = time.perf_counter() - started
        meeting = [r for r in ev.ranked() if r.meets]
        best = meeting[0] if meeting else None
        entry = {"search_wall_s": round(wall, 1), "sims": ev.sims, "space_size": ev.actions.size, "met": bool(best)}
        if best is not None:
            confirmed = simulate_serving(ctx, best.plan, long_cfg, graph=graph)
            entry |= {"search": _row(best.result), "confirmed": _row(confirmed),
                      "confirmed_meets": confirmed.metrics.ttft_s["mean"] <= cfg.ttft_slo_s
                      and confirmed.metrics.tpot_s["mean"] <= cfg.tpot_slo_s}
        else:
            closest = min((r for r in ev.records.values() if r.feasible), key=lambda r: max(r.ttft_over, r.tpot_over),
                          default=None)
            if closest is not None:
                entry["closest"] = _row(closest.result) | {"ttft_over_pct": round(100 * closest.ttft_over, 1),
                                                           "tpot_over_pct": round(100 * closest.tpot_over, 1)}
        out[mode] = entry
    a, d = (out.get(m, {}).get("search", {}).get("tokens_per_s_per_gpu") for m in MODES)
    if a and d:
        out["winner"] = "disagg" if d > a else "agg"
        out["margin"] = round(max(a, d) / min(a, d) - 1, 4)
        out["disagg_over_agg"] = round(d / a, 4)
    else:
        out["winner"] = ("disagg" if d else ("agg" if a else None)) if len(modes) == 2 else None
        out["margin"] = None
    return out


def replace_search(budget: int, mode: str, case: Case) -> ServingSearchConfig:
    return replace(ServingSearchConfig(), budget=budget, modes=[mode], max_num_seqs=list(case.max_num_seqs))


def _print(r: dict) -> None:
    print(f"\n{r['case']}: {r['model']} on {r['gpus']} GPUs, {r['runtime']}, {r['concurrency']} clients, "
          f"ISL {r['isl']} OSL {r['osl']}, TTFT <= {r['slo']['ttft_ms']:g} ms, TPOT <= {r['slo']['tpot_ms']:g} ms "
          f"({r['method']}, {r['budget']} simulations per mode)")
    for mode in MODES:
        if mode not in r:
            continue
        e = r[mode]
        if e["met"]:
            s, c = e["search"], e["confirmed"]
            print(f"  {mode:6s} {s['plan']}: {s['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU, "
                  f"{s['tokens_per_s_per_user']:.1f} tokens/s/user, TTFT {s['ttft_ms']:,.0f} ms, TPOT {s['tpot_ms']:.1f} ms,"
                  f" goodput {s['goodput']:.2f}; confirmed at more requests: {c['tokens_per_s_per_gpu']:,.1f} "
                  f"tokens/s/GPU, TTFT {c['ttft_ms']:,.0f} ms, TPOT {c['tpot_ms']:.1f} ms "
                  f"({'meets' if e['confirmed_meets'] else 'misses'}) [{e['sims']} of {e['space_size']} plans, "
                  f"{e['search_wall_s']} s]")
        else:
            c = e.get("closest")
            print(f"  {mode:6s} no plan meets the SLOs" + (f"; closest {c['plan']} ({c['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU): TTFT +{c['ttft_over_pct']}%, "
                                                         f"TPOT +{c['tpot_over_pct']}%" if c else ""))
    if r["margin"] is not None:
        print(f"  winner: {r['winner']} by {100 * r['margin']:.1f}% tokens/s/GPU")
    elif not all(m in r for m in MODES):
        print("  (one mode searched: no winner)")
    else:
        print(f"  winner: {r['winner'] or 'none'} (the other mode meets no SLO)")


def screen_table(name: str, k: int = 4) -> list[dict]:
    """The ``k`` disaggregated plans the pool-by-pool screening ranks first on case ``name``, screened
    against simulated (tokens/s/GPU, mean TTFT, mean TPOT)."""
    case = CASES[name]
    ctx, cfg, graph = _scenario(case, case.requests_per_client)
    space = ServingSpace(ctx, RUNTIMES[case.runtime], max_len=case.isl + case.osl, max_num_seqs=case.max_num_seqs)
    rows = []
    for sc in screen_plans(space, cfg, k):
        m = simulate_serving(ctx, sc.plan, cfg, graph=graph).metrics
        row = {"case": name, "plan": sc.plan.describe(),
               "screened": {"tokens_per_s_per_gpu": round(sc.tokens_per_s_per_gpu, 1), "ttft_ms": round(sc.ttft_s * 1e3),
                            "tpot_ms": round(sc.tpot_s * 1e3, 2)},
               "simulated": {"tokens_per_s_per_gpu": round(m.output_tokens_per_s_per_gpu, 1),
                             "ttft_ms": round(m.ttft_s["mean"] * 1e3), "tpot_ms": round(m.tpot_s["mean"] * 1e3, 2)}}
        rows.append(row)
        print(f"{name}: {row['plan']}: screened {row['screened']}, simulated {row['simulated']}")
    return rows


def methods_table(name: str, budget: int, seeds: int, pool_seeds: int | None = None) -> dict:
    """Every method at ``budget`` simulations on the joint space of case ``name``: the fraction of
    the exact optimum (all plans simulated) each reaches, median and worst over the seeds
    (``pool_seeds``: the warm start's disaggregated seeds, ``None``: the default)."""
    case = CASES[name]
    ctx, cfg, graph = _scenario(case, case.requests_per_client)
    joint = OmegaConf.structured(replace(replace_search(budget, "agg", case), modes=["agg", "disagg"],
                                         exact_limit=100_000))
    if pool_seeds is not None:
        joint.pool_seeds = pool_seeds
    started = time.perf_counter()
    exact, _ = search_plans(ctx, cfg, joint, "exact", 0, graph=graph, pcfg=planner_config("exact"))
    optimum = exact.best_value
    print(f"\n{name}: exact optimum {optimum:,.1f} tokens/s/GPU ({exact.actions.plan(exact.best_key).describe()}), "
          f"{exact.sims} plans simulated in {time.perf_counter() - started:.1f} s; budget {budget} per method")
    rows = {}
    for method in METHODS:
        if method == "exact":
            continue
        fractions, pcfg = [], planner_config(method)  # the settings shard-search planner=<method> runs with
        for seed in range(1 if method in ("megatron", "poolwise") else seeds):  # deterministic
            ev, _ = search_plans(ctx, cfg, joint, method, seed, graph=graph, pcfg=pcfg)
            fractions.append(max(ev.best_value, 0.0) / optimum)
        rows[method] = {"median": round(float(np.median(fractions)), 3), "worst": round(min(fractions), 3)}
        print(f"  {method:12s} median {rows[method]['median']:.3f}  worst {rows[method]['worst']:.3f}")
    return {"case": name, "budget": budget, "space_size": exact.sims, "optimum": optimum, "methods": rows}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    ap.add_argument("--method", default="ppo")
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--confirm", type=int, default=12, help="requests per client of the confirming simulation")
    ap.add_argument("--concurrency", nargs="*", default=[], help="CASE=N overrides")
    ap.add_argument("--requests-per-client", type=int, default=None,
                    help="requests per client in the search (default: the case's, 4)")
    ap.add_argument("--methods-on", choices=list(CASES), help="compare every method on this case instead")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--pool-seeds", type=int, default=None,
                    help="--methods-on: the warm start's disaggregated seeds (default: serving.search.pool_seeds)")
    ap.add_argument("--runtime", choices=list(RUNTIMES), help="serve every chosen case with this runtime profile")
    ap.add_argument("--screen", action="store_true",
                    help="print the screening's first disaggregated seeds of each case, screened against simulated")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                    help="search only these modes (e.g. --modes agg --method exact: the aggregated optimum)")
    args = ap.parse_args(argv)
    if args.pool_seeds is not None and args.pool_seeds < 0:
        ap.error(f"--pool-seeds must be >= 0, got {args.pool_seeds}")  # one line, exit 2
    if args.budget < 1:
        ap.error(f"--budget must be >= 1, got {args.budget}")
    if args.methods_on:
        table = methods_table(args.methods_on, args.budget, args.seeds, args.pool_seeds)
        print(dumps({k: v for k, v in table.items()}))
        return table
    if args.screen:
        rows = [row for name in args.cases for row in screen_table(name)]
        print(dumps({"screen": rows}))
        return {"screen": rows}
    conc = {k: int(v) for k, v in (s.split("=") for s in args.concurrency)}
    results = {}
    for name in args.cases:
        case = CASES[name] if name not in conc else replace(CASES[name], concurrency=conc[name])
        if args.requests_per_client:
            case = replace(case, requests_per_client=args.requests_per_client)
        if args.runtime:
            case = replace(case, runtime=args.runtime)
        results[name] = compare(name, case, args.method, args.budget, args.seed, args.confirm,
                                tuple(m for m in MODES if m in args.modes))
        _print(results[name])
    line = {k: {"winner": v["winner"], "margin": v["margin"],
                "agg_closest_miss": v.get("agg", {}).get("closest"),
                "disagg_closest_miss": v.get("disagg", {}).get("closest"),
                "agg": v.get("agg", {}).get("search", {}).get("tokens_per_s_per_gpu"),
                "disagg": v.get("disagg", {}).get("search", {}).get("tokens_per_s_per_gpu"),
                "agg_plan": v.get("agg", {}).get("search", {}).get("plan"),
                "disagg_plan": v.get("disagg", {}).get("search", {}).get("plan")}
            for k, v in results.items()}
    print(dumps(line))
    return results


if __name__ == "__main__":
    main()
