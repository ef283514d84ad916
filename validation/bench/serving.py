"""Serving-simulator speed: 1000 requests per scenario, wall time of one run.

``python -m validation.bench.serving [--scenarios a,b] [--requests N] [--repeats R]``. Each scenario's
model, GPUs and precision come from its ``conf/experiment`` config (ISL 1024, OSL 1024 unless given).
``dense-70b-1node`` and ``deepseek-8node`` run one aggregated worker of Megatron sharding over the whole
cluster (TP8; TP8 x 8 data-parallel attention groups with 8-way expert parallelism on 64 GPUs), vLLM's
profile, concurrency 64, no topology graph. ``deepseek-wide-ep`` runs DeepSeek-V3 as SGLang's wide-EP
deployments do (``sglang-deepep``, concurrency 512): a prefill worker of EP16 over 2 nodes and a decode
worker of EP32 attention-DP over 4 nodes on ``deepseek-8node``'s 8-node rail fabric, the KV hand-offs
and the steps' DeepEP exchanges as flows on it (:mod:`simcore.serving.fabric`). The fastest of
``--repeats`` runs is kept (the machine is shared). Ends with one JSON line mapping each scenario to
``{"wall_s", "requests", "iterations", "flows", "lowerings", "target_s"}``.
"""

from __future__ import annotations

import argparse
import time

from simcore.files import dumps
from simcore.serving import LengthDist, ServingConfig, ServingPlan, simulate_serving
from simcore.serving.plan import Pool, runtime_strategy
from simcore.strategy.sharding import megatron_strategy
from topologies.presets import build_topology
from validation.studies.common.scenarios import scenario_context

__all__ = ["main", "PLANS", "TARGET_S"]

PLANS = {"dense-70b-1node": dict(tp=8), "deepseek-8node": dict(tp=8, ep=8), "deepseek-wide-ep": None}
TARGET_S = {"dense-70b-1node": 1.0, "deepseek-8node": 5.0, "deepseek-wide-ep": 10.0}
#: the wide-EP scenario: (context scenario, topology, nodes, runtime, concurrency)
WIDE_EP = ("deepseek-8node", "h100-ib-rail", 8, "sglang-deepep", 512)


def _setup(name: str, args):
    """The context, plan, config and topology graph (or None) of one scenario."""
    lengths = dict(num_requests=args.requests, input_len=LengthDist(mean=args.isl), output_len=LengthDist(mean=args.osl))
    if PLANS[name] is None:
        scenario, topology, nodes, runtime, concurrency = WIDE_EP
        plan = ServingPlan.disaggregated(Pool(runtime_strategy(tp=1, ep=16), 1, 1024),
                                         Pool(runtime_strategy(tp=1, ep=32), 1, 1024))
        cfg = ServingConfig(concurrency=args.concurrency or concurrency, runtime=runtime, **lengths)
        return scenario_context(scenario), plan, cfg, build_topology(topology, num_nodes=nodes)
    plan = ServingPlan.aggregated(megatron_strategy(**PLANS[name]), 1, 256)
    return scenario_context(name), plan, ServingConfig(concurrency=args.concurrency or 64, **lengths), None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(PLANS))
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=0, help="0: the scenario's (64; wide EP 512)")
    parser.add_argument("--isl", type=int, default=1024)
    parser.add_argument("--osl", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    figures = {}
    for name in args.scenarios.split(","):
        if name not in PLANS:
            parser.error(f"--scenarios: {name!r} is not one of {', '.join(PLANS)}")
        ctx, plan, cfg, graph = _setup(name, args)
        best, result = float("inf"), None
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = simulate_serving(ctx, plan, cfg, graph=graph)
            best = min(best, time.perf_counter() - start)
        if not result.feasible:
            raise SystemExit(f"{name}: plan infeasible: {result.reason}")
        m = result.metrics
        flows = result.network.get("flows", 0)
        print(f"{name:18s} {plan.describe():40s} {best:6.3f} s wall (target <= {TARGET_S[name]} s)  "
              f"{m.requests} requests, {result.steps} iterations, {flows} flows, {result.lowerings} lowerings;  "
              f"TTFT {m.ttft_s['mean'] * 1e3:.0f} ms, TPOT {m.tpot_s['mean'] * 1e3:.2f} ms, "
              f"{m.output_tokens_per_s_per_gpu:.0f} tok/s/GPU")
        figures[name] = {"wall_s": round(best, 4), "requests": m.requests, "iterations": result.steps,
                         "flows": flows, "lowerings": result.lowerings, "target_s": TARGET_S[name]}
    print(dumps(figures))
    return figures


if __name__ == "__main__":
    main()
