"""The per-GPU engine: folded equals per-GPU wherever ``sim.mode=auto`` folds, lanes shared along
proven symmetries equal one lane per GPU, placement is priced as placed, skewed routing gives ranks
their own work, traces draw every GPU and every trace has link counters."""

import subprocess
import sys

import numpy as np
import pytest

from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, RoutingConfig, simulate
from simcore.engine.moework import RankPrograms
from simcore.strategy.sharding import Strategy
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
    code = "import sys; from planner.apps.sim import main; sys.argv = ['shard-sim', 'sim.mode=fast']; main()"
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
    from simcore.network.flownet import FlowNetwork

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


@pytest.mark.parametrize("placement", ["pack", "spread"])
def test_block_symmetries_merge_an_ep_axis_the_shift_by_one_cannot(placement):
    """TP2 x EP8 over two nodes per stage: an EP group has 4 ranks in each node, so the shift of
    the EP rank by one takes a node's last rank to the next node and is no symmetry; the rotation
    inside each node and the shift by a node are, and together they merge the axis whole."""
    from simcore.engine.alltoallv import pxn_relay
    from simcore.engine.lanes import _is_symmetry
    from simcore.engine.phase import choose_mode, placement_of

    ctx = make_ctx("mixtral-8x7b", 32, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=4)
    s = Strategy(tp=2, ep=8, pp=2, dp=1, batch=64)
    _, _, orbits = choose_mode(ctx, graph, s, EngineConfig(placement=placement, mode="per-gpu"))
    assert orbits["e"] == [0] * 8
    import simpy

    from simcore.network.flownet import FlowNetwork

    net = FlowNetwork(simpy.Environment(), graph)
    placed = placement_of(graph, s, placement)
    assert not _is_symmetry(placed, graph, net, "e", ("shift", 1), pxn_relay, frozenset({"ep"}), None, frozenset())
    cfg = dict(placement=placement, mode="per-gpu")
    shared = simulate(ctx, graph, s, EngineConfig(**cfg))
    alone = simulate(ctx, graph, s, EngineConfig(share_lanes=False, **cfg))
    auto = simulate(ctx, graph, s, EngineConfig(placement=placement))
    assert (shared.lanes, alone.lanes, auto.mode) == (2, 32, "folded")
    assert shared.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)
    assert auto.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)


def test_a_route_that_branches_is_never_proven_to_map():
    """Across leaves of a fat tree ECMP picks a spine per pair and flow key, so no permutation can be
    proven to map such a route; within a node or a leaf the one route can."""
    import simpy

    from simcore.engine.lanes import _Check
    from simcore.network.flownet import FlowNetwork

    graph = build_topology("h100-ib-fattree", num_nodes=4, nodes_per_leaf=2)
    net = FlowNetwork(simpy.Environment(), graph)
    assert not net.forks("gpu0", "gpu1") and not net.forks("gpu0", "gpu8")  # NVSwitch; one leaf
    assert net.forks("gpu0", "gpu16")  # leaf to leaf over either spine
    sigma = {f"gpu{k}": f"gpu{(k + 8) % 32}" for k in range(32)}  # node by node
    check = _Check(None, graph, net, sigma, lambda *_: None, frozenset(), None, frozenset())
    assert check.same_route("gpu0", "gpu1")
    assert not check.same_route("gpu8", "gpu16")  # its image gpu16 -> gpu24 stays in a leaf
    assert not _Check(None, graph, net, {}, lambda *_: None, frozenset(), None, frozenset()).same_route("gpu0", "gpu16")


def test_candidate_permutations_of_an_axis():
    from simcore.engine.lanes import _candidates, _moved

    assert _candidates(8) == [("shift", 1), ("rotate", 2), ("shift", 2), ("rotate", 4), ("shift", 4)]
    assert [_moved(x, 8, ("rotate", 4)) for x in range(8)] == [1, 2, 3, 0, 5, 6, 7, 4]
    assert [_moved(x, 8, ("shift", 4)) for x in range(8)] == [4, 5, 6, 7, 0, 1, 2, 3]


def test_lanes_group_the_gpus_of_each_orbit():
    """An axis proven symmetric only in part (EP ranks 0 ~ 2 and 1 ~ 3): one lane per orbit and stage."""
    from simcore.engine.lanes import build_lanes
    from simcore.engine.phase import placement_of

    graph = build_topology("h100-ib-rail", num_nodes=2)
    placed = placement_of(graph, Strategy(tp=2, ep=4, pp=2, dp=1, batch=64), "pack")
    lanes = build_lanes(placed, {"i": [0, 0], "d": [0], "e": [0, 1, 0, 1]})
    assert [(ln.stage, ln.e, ln.ranks) for ln in lanes] == [
        (0, 0, [0, 1, 4, 5]), (0, 1, [2, 3, 6, 7]), (1, 0, [8, 9, 12, 13]), (1, 1, [10, 11, 14, 15])]
    assert len(build_lanes(placed)) == 16


def test_symmetries_are_memoized_on_every_input_they_depend_on():
    """A second ask with the same placement returns the fresh answer; a changed input is asked afresh."""
    import simpy

    from simcore.engine import lanes
    from simcore.engine.alltoallv import pxn_relay
    from simcore.engine.phase import placement_of
    from simcore.network.flownet import FlowNetwork

    graph = build_topology("h100-ib-rail", num_nodes=4)
    net = FlowNetwork(simpy.Environment(), graph)
    placed = placement_of(graph, Strategy(tp=2, ep=8, pp=2, dp=1, batch=64), "pack")
    args = (placed, graph, net, True, pxn_relay, frozenset({"ep"}), None, frozenset())
    first = lanes.symmetric_axes(*args)
    assert first == lanes._symmetric_axes(*args) and first[0]["e"] == [0] * 8
    first[0]["e"][0] = 5  # the caller's copy, not the memo's
    assert lanes.symmetric_axes(*args) == lanes._symmetric_axes(*args)
    unequal = lanes.symmetric_axes(placed, graph, net, False, *args[4:])
    assert unequal == lanes._symmetric_axes(placed, graph, net, False, *args[4:])
    assert unequal[1]["e"] == "EP ranks have different routed work"
    spread = placement_of(graph, placed.s, "spread")
    assert lanes.symmetric_axes(spread, *args[1:]) == lanes._symmetric_axes(spread, *args[1:])


@pytest.mark.slow
@pytest.mark.parametrize(("topo", "kw"), [("h100-ib-rail", {}), ("h100-roce", {}), ("h100-efa", {}),
                                          ("h100-ib-fattree", {"nodes_per_leaf": 2})])
def test_shared_lanes_equal_one_lane_per_gpu_on_four_nodes(topo, kw):
    """EP groups across nodes with several ranks in each (where the block symmetries merge lanes),
    on rail, RoCE, EFA and a two-leaf fat tree, both placements: shared lanes = one lane per GPU."""
    ctx = make_ctx("mixtral-8x7b", 32, "decode")
    graph = build_topology(topo, num_nodes=4, **kw)
    plans = _plans(ctx, 2, seed=11) + [Strategy(tp=2, ep=8, pp=2, dp=1, batch=64),
                                       Strategy(tp=1, ep=8, pp=2, dp=2, batch=64)]
    shared_somewhere = False
    for s in plans:
        for placement in ("pack", "spread"):
            cfg = dict(placement=placement, mode="per-gpu")
            shared = simulate(ctx, graph, s, EngineConfig(**cfg))
            if shared.lanes == s.gpus:
                continue
            shared_somewhere = True
            alone = simulate(ctx, graph, s, EngineConfig(share_lanes=False, **cfg))
            assert shared.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9), (placement, s)
    assert shared_somewhere
