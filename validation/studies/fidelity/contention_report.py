"""Where and why the simulator (contention and overlap on) differs from the proxy.

``python -m validation.studies.fidelity.contention_report [--scenarios a,b] [--strategies 8]``. For each scenario it
simulates the Megatron heuristic's top strategies twice: with overlap only (contention off) and with
both on, so the step-time ratio to the proxy splits into what overlap saves and what link sharing
costs. It prints the largest deviations with the simulator's own breakdown of the critical stage and
ends with one JSON line.
"""

from __future__ import annotations

import argparse
import statistics

from planner.megatron import megatron_search
from simcore.engine import EngineConfig, simulate
from simcore.files import dumps
from topologies.scenario import build_graph
from validation.studies.common.scenarios import scenario_config, scenario_context
from validation.studies.fidelity.explain import critical_split, overlap_contention_why

__all__ = ["main"]

DEFAULT = ("dense-70b-1node", "dense-70b-prefill", "mixtral-2node", "deepseek-8node")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(DEFAULT))
    parser.add_argument("--strategies", type=int, default=8)
    args = parser.parse_args(argv)
    figures = {}
    for name in args.scenarios.split(","):
        cfg, ctx = scenario_config(name), scenario_context(name)
        graph = build_graph(cfg.topology, cfg.hardware)
        ranked = megatron_search(ctx)
        rows = []
        for i in range(min(args.strategies, ranked.num_valid)):
            s = ranked.strategy(i)
            ov = simulate(ctx, graph, s, EngineConfig(contention=False, overlap=True))
            full = simulate(ctx, graph, s, EngineConfig(contention=True, overlap=True))
            r_ov, r_full = ov.step_time_s / ov.proxy_step_time_s, full.step_time_s / full.proxy_step_time_s
            crit = critical_split(full.split)
            rows.append({"strategy": f"tp{s.tp} ep{s.ep} pp{s.pp} dp{s.dp} b{s.batch} mb{s.microbatches}",
                         "overlap_only": round(r_ov, 4), "sim_over_proxy": round(r_full, 4),
                         "exposed_comm_ms": round(crit["exposed_comm"] * 1e3, 3),
                         "bubble_ms": round((crit["bubble"] + crit["idle"]) * 1e3, 3),
                         "why": overlap_contention_why(r_ov, r_full)})
        ratios = [r["sim_over_proxy"] for r in rows]
        print(f"\n{name}: sim/proxy step over {len(rows)} top Megatron strategies: "
              f"median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
        for r in sorted(rows, key=lambda r: -abs(r["sim_over_proxy"] - 1))[:4]:
            print(f"  {r['strategy']:<34} overlap only {r['overlap_only']:.3f}  both {r['sim_over_proxy']:.3f}  "
                  f"exposed comm {r['exposed_comm_ms']} ms  bubble+idle {r['bubble_ms']} ms: {r['why']}")
        figures[name] = {"median_sim_over_proxy": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                         "rows": rows}
    print(dumps({k: {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in figures.items()}))
    return figures


if __name__ == "__main__":
    main()
