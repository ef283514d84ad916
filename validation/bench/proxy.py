"""Proxy speed: strategies per second through the batch API, and the time of one scalar call.

``python -m validation.bench.proxy [--scenario deepseek-8node] [--n 100000]``. Uses the benchmark
scenario's model, cluster and workload, random strategies over the whole search space (valid and
invalid alike, as a planner sees them). Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner.megatron import strategy_from_key
from planner.space import SearchSpace
from simcore.cost.lowering import StrategyArrays, _scalar_collective_s
from simcore.cost.proxy import evaluate, evaluate_batch
from simcore.files import dumps
from validation.studies.common.scenarios import random_keys, scenario_context

__all__ = ["main"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="deepseek-8node")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scalar-calls", type=int, default=300)
    args = parser.parse_args(argv)

    ctx = scenario_context(args.scenario)
    space = SearchSpace.for_context(ctx)
    keys = random_keys(space, args.n)
    arrays = StrategyArrays.from_keys(keys)
    evaluate_batch(ctx, StrategyArrays.from_keys(keys[:100]))  # warm caches and imports
    batch_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = evaluate_batch(ctx, arrays)
        batch_s.append(time.perf_counter() - start)
    per_s = args.n / statistics.median(batch_s)

    strategies = [strategy_from_key(k) for k in keys[: args.scalar_calls]]
    evaluate(ctx, strategies[0])
    cold, warm = [], []
    for s in strategies:  # cold: collective memo cleared first; warm: as inside a search
        _scalar_collective_s.cache_clear()
        start = time.perf_counter()
        evaluate(ctx, s)
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        evaluate(ctx, s)
        warm.append(time.perf_counter() - start)
    scalar_ms = statistics.median(warm) * 1e3
    cold_ms = statistics.median(cold) * 1e3
    valid = float(result.valid.mean())
    print(f"scenario {args.scenario}: {ctx.model.name}, {ctx.cluster.num_gpus} GPUs, {ctx.workload.phase}")
    print(f"batch API: {args.n} strategies in {statistics.median(batch_s):.3f} s (median of {args.repeats}) "
          f"-> {per_s:,.0f} strategies/s; {valid:.1%} valid")
    print(f"scalar evaluate() with breakdown: median {scalar_ms:.3f} ms with the collective memo warm, "
          f"{cold_ms:.3f} ms cold, over {len(warm)} random strategies")
    figures = {"batched_strategies_per_s": round(per_s, 1), "scalar_call_ms": round(scalar_ms, 4),
               "scalar_call_cold_ms": round(cold_ms, 4),
               "scenario": args.scenario, "n": args.n}
    print(dumps(figures))
    return figures


if __name__ == "__main__":
    main()
