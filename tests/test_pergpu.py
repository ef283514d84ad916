"""The per-GPU engine: folded equals per-GPU wherever ``sim.mode=auto`` folds, lanes shared along
proven symmetries equal one lane per GPU, placement is priced as placed, skewed routing gives ranks
their own work, traces draw every GPU and every trace has link counters."""

import subprocess
import sys

import numpy as np
import pytest

from simcore.engine import EngineConfig, RoutingConfig, simulate
from simcore.engine.moework import RankPrograms
from simcore.proxy import evaluate
from simcore.strategy import Strategy
from tests.conftest import make_ctx
from tests.test_proxy import random_strategy
from topologies import build_topology

# (model, gpus, phase, topology, nodes, kwargs) -- three topologies
TOPOLOGIES = [
    ("llama-3.1-8b", 8, "decode", "hgx-h100", 1, {}),
    ("mixtral-8x7b", 16, "decode", "h100-ib-rail", 2, {}),
    ("mixtral-8x7b", 16, "prefill", "h100-ib-fattree", 2, {"oversubscription": 2.0, "nodes_per_leaf": 1}),
]


def _plans(ctx, n, seed):
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    while len(out) < n:
        s = random_strategy(lambda a, b: int(rng.integers(a, b + 1)), ctx.cluster.num_gpus, ctx.model.is_moe)
        if s.gpus == ctx.cluster.num_gpus and s.key() not in seen and evaluate(ctx, s).valid:
            seen.add(s.key())
            out.append(s)
    return out


def _folded_equals_per_gpu(plans_per_topology: int) -> None:
    folds = 0
    for model, gpus, phase, topo, nodes, kw in TOPOLOGIES:
        ctx = make_ctx(model, gpus, phase, input_len=512 if phase == "prefill" else 2048)
        graph = build_topology(topo, num_nodes=nodes, **kw)
        for s in _plans(ctx, plans_per_topology, seed=gpus + len(topo)):
            for placement in ("pack", "spread"):
                auto = simulate(ctx, graph, s, EngineConfig(placement=placement))
                if auto.mode != "folded":
                    assert auto.mode_reason.startswith("auto: "), auto.mode_reason
                    continue
                folds += 1
                ref = simulate(ctx, graph, s, EngineConfig(placement=placement, mode="per-gpu", share_lanes=False))
                assert ref.lanes == s.gpus
                assert auto.step_time_s == pytest.approx(ref.step_time_s, rel=0.01), (topo, placement, s)
    assert folds > 0  # the comparison is not vacuous
    print(f"auto folded {folds} of {len(TOPOLOGIES) * 2 * plans_per_topology} (plan, placement, topology) cases")


def test_folded_equals_per_gpu_where_auto_folds():
    _folded_equals_per_gpu(plans_per_topology=4)


@pytest.mark.slow
def test_folded_equals_per_gpu_where_auto_folds_100_plans():
    _folded_equals_per_gpu(plans_per_topology=34)  # 102 plans x 2 placements x 3 topologies


_ZIPF = RoutingConfig("zipf", 1.2, sampled=True)


@pytest.mark.parametrize(("routing", "plans"), [(RoutingConfig(), 4), (_ZIPF, 1),
                                                pytest.param(_ZIPF, 4, marks=pytest.mark.slow)])
def test_shared_lanes_equal_one_lane_per_gpu(routing, plans):
    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=2)
    for s in _plans(ctx, 4, seed=5)[:plans] + [Strategy(tp=2, ep=4, pp=1, dp=2, batch=64)]:
        for placement in ("pack", "spread"):
            cfg = dict(placement=placement, mode="per-gpu", routing=routing)
            shared = simulate(ctx, graph, s, EngineConfig(**cfg))
            alone = simulate(ctx, graph, s, EngineConfig(share_lanes=False, **cfg))
            assert alone.lanes == s.gpus
            assert shared.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9), (placement, s)


def test_spread_placement_priced_as_placed():
    """TP8 spread over 8 nodes: every TP group crosses InfiniBand. Folded used to take the packed
    (NVLink) cost for these uncontended all-reduces: 17.8 ms against 37.8 ms for all groups as flows."""
    ctx = make_ctx("llama-3.1-70b", 64, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=8)
    s = Strategy(tp=8, ep=1, pp=1, dp=8, batch=64)
    pack = simulate(ctx, graph, s, EngineConfig(placement="pack"))
    runs = [simulate(ctx, graph, s, EngineConfig(placement="spread", **kw))
            for kw in ({}, {"mode": "folded", "representative": False}, {"mode": "per-gpu", "share_lanes": False})]
    assert runs[0].step_time_s > 1.5 * pack.step_time_s
    for r in runs[1:]:
        assert runs[0].step_time_s == pytest.approx(r.step_time_s, rel=0.01)


def test_skewed_routing_runs_per_gpu_with_per_rank_work():
    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=2)
    s = Strategy(tp=1, ep=8, pp=1, dp=2, batch=256)
    skew = EngineConfig(routing=RoutingConfig("zipf", 1.5))
    work = RankPrograms(ctx, s, "decode", None, skew)
    experts = [sum(op.duration_s for op in work.programs(e, 0)[0].ops if op.name == "expert_ffn1") for e in range(8)]
    loads = work.work(0, 0).loads
    assert loads.max() > 1.5 * loads.min()  # ranks receive different token counts...
    assert max(experts) > min(experts) * 1.02  # ...so they own different expert work (weight-bound decode)
    r = simulate(ctx, graph, s, skew)
    assert r.mode == "per-gpu" and "routing" in r.mode_reason
    assert r.flows_run > 0 and r.network_events > 0  # dispatch/combine as all-to-all-v flows
    uniform = simulate(ctx, graph, s, EngineConfig())
    assert r.step_time_s > uniform.step_time_s


def test_per_gpu_trace_draws_every_gpu_and_every_trace_has_link_counters():
    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=2)
    s = Strategy(tp=2, ep=4, pp=2, dp=1, batch=64, microbatches=2)
    r = simulate(ctx, graph, s, EngineConfig(mode="per-gpu", trace=True))
    drawn = {e["args"]["name"].split()[0] for e in r.trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert drawn == {f"gpu{k}" for k in range(16)}
    for cfg in (EngineConfig(trace=True, contention=False), EngineConfig(trace=True, mode="folded")):
        t = simulate(ctx, graph, s, cfg).trace
        counters = [e for e in t["traceEvents"] if e["ph"] == "C"]
        assert counters and all(0.0 <= e["args"]["utilization"] <= 1.0 + 1e-9 for e in counters)


def test_unknown_mode_is_rejected_with_the_field_named():
    with pytest.raises(ValueError, match="sim.mode"):
        EngineConfig(mode="fast")
    code = "import sys; from simcore.apps.sim import main; sys.argv = ['shard-sim', 'sim.mode=fast']; main()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: sim.mode")


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_a_seed_numpy_cannot_take_is_rejected_with_the_field_named(seed):
    with pytest.raises(ValueError, match="sim.seed"):
        EngineConfig(seed=seed)
    assert EngineConfig(seed=0).seed == 0


def test_alltoallv_with_equal_pairs_is_the_direct_all_to_all_and_waits_for_its_largest_pair():
    import simpy

    from simcore.collectives.flows import run_collective
    from simcore.engine.alltoallv import run_alltoallv
    from simcore.network import FlowNetwork

    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=2)
    ranks = [f"gpu{k}" for k in (0, 1, 8, 9)]
    chunk = 4e6

    def run(make):
        env = simpy.Environment()
        net = FlowNetwork(env, graph)
        proc = make(env, net)
        env.run(until=proc)
        return proc.value

    direct = run(lambda env, net: run_collective(env, net, "all_to_all", chunk * 4, ranks, algorithm="direct"))
    equal = run(lambda env, net: env.process(run_alltoallv(env, net, ctx, ranks, np.full((4, 4), chunk))))
    assert equal == pytest.approx(direct, rel=1e-9)
    hot = np.full((4, 4), chunk)
    hot[:, 2] = 3 * chunk  # every rank sends three times as much to rank 2
    skewed = run(lambda env, net: env.process(run_alltoallv(env, net, ctx, ranks, hot)))
    assert skewed > 1.5 * direct
