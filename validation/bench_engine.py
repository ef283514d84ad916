"""Simulator speed: wall time of one simulated step per scenario, and the simulator/proxy ratio.

``python -m validation.bench_engine [--scenarios a,b]``. For each scenario, the Megatron heuristic's
best strategy and the best strategy the proxy finds over every per-operator sharding of the
Megatron degrees (a cheap stand-in for the planner) are simulated with contention and overlap on.
Ends with one JSON line mapping each scenario to ``{"sim_wall_s", "proxy_wall_s", "gpus", ...}``.
"""

from __future__ import annotations

import argparse
import json
import time

from planner.megatron import megatron_search
from simcore.config import build_engine_config, build_graph
from simcore.engine import simulate
from simcore.proxy import evaluate
from validation.scenarios import scenario_config, scenario_context

__all__ = ["main"]

DEFAULT = ("dense-70b-1node", "deepseek-8node", "gptmoe-1.6t-16k")
TARGET_S = {"dense-70b-1node": 0.2, "deepseek-8node": 1.0, "gptmoe-1.6t-16k": 10.0}


def _timed(func, repeats: int = 1):
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = func()
        best = min(best, time.perf_counter() - start)
    return best, value


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(DEFAULT))
    args = parser.parse_args(argv)
    figures = {}
    for name in args.scenarios.split(","):
        cfg = scenario_config(name)
        ctx = scenario_context(name)
        graph = build_graph(cfg.topology, cfg.hardware)
        engine = build_engine_config(cfg.sim)
        strategy = megatron_search(ctx).strategy(0)
        proxy_s, proxy = _timed(lambda s=strategy, c=ctx: evaluate(c, s), repeats=20)
        sim_s, sim = _timed(lambda s=strategy, c=ctx, g=graph, e=engine: simulate(c, g, s, e))
        figures[name] = {"sim_wall_s": round(sim_s, 4), "proxy_wall_s": round(proxy_s, 6),
                         "sim_over_proxy_wall": round(sim_s / proxy_s, 1), "gpus": ctx.cluster.num_gpus,
                         "target_s": TARGET_S.get(name), "network_events": sim.network_events,
                         "sim_over_proxy_step": round(sim.step_time_s / proxy.step_time_s, 4),
                         "strategy": {k: getattr(strategy, k) for k in ("tp", "ep", "pp", "dp", "batch",
                                                                         "microbatches")}}
        print(f"{name:>18}: {ctx.cluster.num_gpus:5d} GPUs  sim {sim_s:8.3f} s  proxy {proxy_s * 1e3:7.3f} ms  "
              f"ratio {sim_s / proxy_s:9.0f}x  events {sim.network_events:7d}  "
              f"sim/proxy step {sim.step_time_s / proxy.step_time_s:.3f}  (target {TARGET_S.get(name)} s)")
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
