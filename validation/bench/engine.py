"""Simulator speed: wall time of one simulated step per scenario, and the simulator/proxy ratio.

``python -m validation.bench.engine [--scenarios a,b]``. For each scenario two plans are simulated
with contention and overlap on: the Megatron heuristic's best and the best proxy strategy (the exact
optimum under the proxy, :mod:`planner.exact`: what any planner's search converges to), each
``--repeats`` times, keeping the fastest (the machine is shared: the minimum is the least noisy). Ends with one
JSON line mapping each scenario to ``{"sim_wall_s", "per_gpu_wall_s", "proxy_wall_s", "gpus", "plans":
{...}}``, where the top-level times are those of the slower plan: ``sim_wall_s`` in the folded mode,
``per_gpu_wall_s`` with ``sim.mode=per-gpu`` (lanes shared only within orbits of proven symmetries,
:mod:`simcore.engine.lanes`).
"""

from __future__ import annotations

import argparse
import time

from planner.exact import exact_optimum
from planner.megatron import megatron_search, strategy_from_key
from planner.space import SearchSpace
from simcore.config import build_engine_config
from simcore.cost.proxy import evaluate
from simcore.engine import simulate
from simcore.files import dumps
from topologies.scenario import build_graph
from validation.studies.common.scenarios import scenario_config, scenario_context

__all__ = ["main"]

DEFAULT = ("dense-70b-1node", "deepseek-8node", "gptmoe-1.6t-16k")
TARGET_S = {"dense-70b-1node": 0.2, "deepseek-8node": 1.0, "gptmoe-1.6t-16k": 10.0}
PER_GPU_TARGET_S = {"deepseek-8node": 1.0, "gptmoe-1.6t-16k": 30.0}


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
    parser.add_argument("--repeats", type=int, default=3, help="simulations per plan; the fastest is kept")
    args = parser.parse_args(argv)
    figures = {}
    for name in args.scenarios.split(","):
        cfg = scenario_config(name)
        ctx = scenario_context(name)
        graph = build_graph(cfg.topology, cfg.hardware)
        engine = build_engine_config(cfg.sim)
        engine.mode = "folded"
        per_gpu = build_engine_config(cfg.sim)
        per_gpu.mode = "per-gpu"
        plans = {"megatron": megatron_search(ctx).strategy(0),
                 "best_proxy": strategy_from_key(exact_optimum(ctx, SearchSpace.for_context(ctx)).key)}
        rows = {}
        for label, strategy in plans.items():
            proxy_s, proxy = _timed(lambda s=strategy, c=ctx: evaluate(c, s), repeats=20)
            sim_s, sim = _timed(lambda s=strategy, c=ctx, g=graph, e=engine: simulate(c, g, s, e), args.repeats)
            gpu_s, gpu = _timed(lambda s=strategy, c=ctx, g=graph, e=per_gpu: simulate(c, g, s, e), args.repeats)
            rows[label] = {"sim_wall_s": round(sim_s, 4), "per_gpu_wall_s": round(gpu_s, 4),
                           "per_gpu_lanes": gpu.lanes, "per_gpu_network_events": gpu.network_events,
                           "per_gpu_over_folded_step": round(gpu.step_time_s / sim.step_time_s, 4),
                           "proxy_wall_s": round(proxy_s, 6),
                           "sim_over_proxy_wall": round(sim_s / proxy_s, 1), "network_events": sim.network_events,
                           "sim_over_proxy_step": round(sim.step_time_s / proxy.step_time_s, 4),
                           "strategy": {k: getattr(strategy, k) for k in ("tp", "ep", "pp", "dp", "batch",
                                                                           "microbatches")}}
            print(f"{name:>18} {label:>10}: {ctx.cluster.num_gpus:5d} GPUs  sim {sim_s:8.3f} s  "
                  f"proxy {proxy_s * 1e3:7.3f} ms  ratio {sim_s / proxy_s:9.0f}x  events {sim.network_events:7d}  "
                  f"sim/proxy step {sim.step_time_s / proxy.step_time_s:.3f}  (target {TARGET_S.get(name)} s)")
            print(f"{'':>18} {'per-gpu':>10}: {gpu.lanes:5d} lanes sim {gpu_s:8.3f} s  events {gpu.network_events:7d}  "
                  f"per-gpu/folded step {gpu.step_time_s / sim.step_time_s:.4f}  (target {PER_GPU_TARGET_S.get(name)} s)")
        slow = max(rows.values(), key=lambda r: r["sim_wall_s"])
        figures[name] = {"sim_wall_s": slow["sim_wall_s"],
                         "per_gpu_wall_s": max(r["per_gpu_wall_s"] for r in rows.values()),
                         "proxy_wall_s": slow["proxy_wall_s"], "gpus": ctx.cluster.num_gpus,
                         "target_s": TARGET_S.get(name), "per_gpu_target_s": PER_GPU_TARGET_S.get(name),
                         "plans": rows}
    print(dumps(figures))
    return figures


if __name__ == "__main__":
    main()
