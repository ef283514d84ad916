"""The discrete-event simulator: equals the proxy with contention and overlap off, conserves time,
respects physics, is deterministic, and reports invalid strategies without raising."""

import numpy as np
import pytest

from planner.megatron import megatron_search
from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, RoutingConfig, simulate
from simcore.engine.program import build_programs
from simcore.engine.rank_loads import rank_loads
from simcore.strategy.sharding import Strategy, megatron_strategy
from tests.conftest import make_ctx
from tests.test_proxy import _decode_bound_tokens_per_s, random_strategy
from topologies import build_topology

OFF = EngineConfig(contention=False, overlap=False)

# (model, gpus, phase, topology) -- at least four models and both phases
CASES = [
    ("llama-3.1-70b", 8, "decode", ("hgx-h100", 1)),
    ("llama-3.1-8b", 8, "prefill", ("hgx-h100", 1)),
    ("mixtral-8x7b", 16, "decode", ("h100-ib-rail", 2)),
    ("mixtral-8x22b", 16, "prefill", ("h100-ib-rail", 2)),
    ("deepseek-v3", 64, "decode", ("h100-ib-rail", 8)),
    ("glm-5", 32, "decode", ("h100-ib-rail", 4)),  # DeepSeek sparse attention: the indexer's time too
]


def _valid_random(ctx, n, seed):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        s = random_strategy(lambda a, b: int(rng.integers(a, b + 1)), ctx.cluster.num_gpus, ctx.model.is_moe)
        if s.gpus == ctx.cluster.num_gpus and evaluate(ctx, s).valid:
            out.append(s)
    return out


@pytest.mark.parametrize(("model", "gpus", "phase", "topo"), CASES)
def test_simulator_equals_proxy_without_contention_and_overlap(model, gpus, phase, topo):
    ctx = make_ctx(model, gpus, phase, input_len=1024 if phase == "prefill" else 2048)
    graph = build_topology(topo[0], num_nodes=topo[1])
    for s in _valid_random(ctx, 42, seed=len(model)):  # 5 x 42 = 210 strategies
        sim = simulate(ctx, graph, s, OFF)
        assert sim.step_time_s == pytest.approx(evaluate(ctx, s).step_time_s, rel=0.01), s


def test_time_split_sums_to_step_and_throughput_is_physical():
    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=2)
    for s in _valid_random(ctx, 3, seed=11):
        r = simulate(ctx, graph, s, EngineConfig())
        for split in r.split:
            assert sum(split.values()) == pytest.approx(r.step_time_s, rel=1e-6)
            assert min(split.values()) >= -1e-12
        assert r.tokens_per_s <= _decode_bound_tokens_per_s(ctx, s) * (1 + 1e-9)


def test_megatron_tp8_decode_two_all_reduces_per_layer_plus_lm_head():
    ctx = make_ctx("llama-3.1-70b", 8, "decode")
    (program,) = build_programs(ctx, megatron_strategy(tp=8, batch=32), "decode")
    per_layer = {}
    for op in program.ops:
        if op.is_comm and op.layer >= 0:
            per_layer.setdefault(op.layer, []).append(op.collective)
    assert len(per_layer) == 80 and all(v == ["all_reduce", "all_reduce"] for v in per_layer.values())
    tail = [op.collective for op in program.ops if op.is_comm and op.layer < 0 and op.op == "lm_head"]
    assert tail == ["all_gather"]


def test_trace_threads_never_partially_overlap_and_are_named():
    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=2)
    s = megatron_search(ctx).strategy(0)
    r = simulate(ctx, graph, s, EngineConfig(trace=True))
    events = r.trace["traceEvents"]
    names = {(e["pid"], e.get("tid")) for e in events if e["ph"] == "M"}
    spans: dict = {}
    for e in events:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in names
            spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for seq in spans.values():
        seq.sort()
        for (_, a1), (b0, _) in zip(seq, seq[1:], strict=False):
            assert b0 >= a1 - 1e-6


def test_same_seed_same_result():
    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=2)
    s = megatron_search(ctx).strategy(0)
    cfg = EngineConfig(routing=RoutingConfig("zipf", 1.2, sampled=True), seed=3)
    a, b = simulate(ctx, graph, s, cfg), simulate(ctx, graph, s, cfg)
    assert a.step_time_s == b.step_time_s and a.split == b.split


def test_skewed_routing_slows_the_moe_step():
    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    graph = build_topology("h100-ib-rail", num_nodes=2)
    s = Strategy(tp=1, ep=8, pp=1, dp=2, batch=256)
    uniform = simulate(ctx, graph, s, EngineConfig())
    skewed = simulate(ctx, graph, s, EngineConfig(routing=RoutingConfig("zipf", 1.5)))
    assert skewed.step_time_s > uniform.step_time_s
    loads = rank_loads(RoutingConfig("zipf", 1.5), 8, 8, 1e4, seed=0)
    assert loads.mean() == pytest.approx(1.0) and loads.max() > 1.5


def test_invalid_strategy_returns_reasons_without_simulating():
    ctx = make_ctx("llama-3.1-70b", 8, "decode")
    graph = build_topology("hgx-h100")
    r = simulate(ctx, graph, megatron_strategy(tp=3, batch=8), EngineConfig())
    assert not r.valid and "device_count" in r.reasons


def test_static_phase_integrates_decode_steps():
    ctx = make_ctx("llama-3.1-8b", 8, "static", input_len=512, output_len=128)
    graph = build_topology("hgx-h100")
    s = megatron_strategy(tp=8, batch=16)
    sim = simulate(ctx, graph, s, OFF)
    assert sim.step_time_s == pytest.approx(evaluate(ctx, s).step_time_s, rel=1e-6)
    assert sim.ttft_s < sim.step_time_s


def test_overlap_survives_preemption_of_a_granted_but_unstarted_kernel():
    """Regression: with overlap on, a microbatch preempted in the instant its compute request was
    granted used to die with an uncaught simpy.Interrupt (deepseek-v3, pp16 x dp4, 8 microbatches)."""
    ctx = make_ctx("deepseek-v3", 64, "decode", input_len=4096)
    graph = build_topology("h100-ib-rail", num_nodes=8)
    s = Strategy(tp=1, ep=1, pp=16, dp=4, batch=8, microbatches=4)
    sim = simulate(ctx, graph, s, EngineConfig())
    assert sim.step_time_s > 0
    off = simulate(ctx, graph, s, EngineConfig(contention=False, overlap=False))
    assert sim.step_time_s <= off.step_time_s * 1.5


def test_concurrent_groups_of_one_stage_contend_on_shared_uplinks():
    """pp=1, so no other stage competes; still, the two EP groups (one per tensor rank) cross the same
    4:1 oversubscribed leaf uplinks at once and must share them (used to take the idle-fabric cost)."""
    ctx = make_ctx("mixtral-8x7b", 16, "prefill", input_len=1024)
    graph = build_topology("h100-ib-fattree", num_nodes=2, oversubscription=4.0, nodes_per_leaf=1)
    s = Strategy(tp=2, ep=8, pp=1, dp=1, batch=16)
    assert evaluate(ctx, s).valid
    idle = simulate(ctx, graph, s, EngineConfig(contention=False, overlap=False))
    shared = simulate(ctx, graph, s, EngineConfig(contention=True, overlap=False))
    assert shared.step_time_s > idle.step_time_s * 1.02
    assert shared.network_events > 0
