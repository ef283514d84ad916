"""The engine under ``sim.routing.a2a=deepep``: an MoE exchange runs DeepEP's kernels (normal mode for
prefill, low latency for decode) on the drawn routing. With uniform routing on an idle fabric it takes
the proxy's DeepEP price, as flows too; skew slows it (its slowest rank); traffic sharing its links
slows its flows; folded and per-GPU agree where auto folds; contention and overlap off, it is the proxy."""

import dataclasses
import types

import numpy as np
import pytest
import simpy

from simcore.collectives import DEFAULT, Fabric
from simcore.collectives.pipeline import nccl_link_efficiency
from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, RoutingConfig, simulate
from simcore.engine.phase import choose_mode, run_folded, run_per_gpu
from simcore.engine.program import build_programs
from simcore.hardware.gpus import get_gpu
from simcore.moe import draw_copies, link_tokens, pair_times_s, uniform_time_s
from simcore.moe.deepep import fp8_token_bytes
from simcore.moe.deepep_exchange import exchange, run_exchange, token_bytes
from simcore.network.flownet import FlowNetwork
from simcore.strategy.sharding import Strategy
from tests.conftest import make_ctx
from topologies import build_topology

DEEPEP = RoutingConfig(a2a="deepep")
SKEW = RoutingConfig("zipf", 1.2, a2a="deepep")


def _ctx(phase: str, gpus: int, routing=DEEPEP):
    return dataclasses.replace(make_ctx("deepseek-v3", gpus, phase, precision="fp8", input_len=512), routing=routing)


def _exchange_times(ctx, graph, s, cfg, phase):
    """``{name: [durations]}`` of the dispatches and combines the engine ran (comm stream), and the run."""
    mode, _, orbits = choose_mode(ctx, graph, s, cfg)
    run = run_folded(ctx, graph, s, cfg, phase) if mode == "folded" else run_per_gpu(ctx, graph, s, cfg, phase,
                                                                                   None, orbits)
    out = {name: [iv.end - iv.start for iv in run.intervals if iv.name == name and iv.stream == "comm"]
           for name in ("dispatch", "combine")}
    return out, run


def _idle_network(graph, gpu: str):
    env = simpy.Environment()
    ctx = types.SimpleNamespace(collective_constants=DEFAULT,
                                cluster=types.SimpleNamespace(fabric=Fabric.from_topology(graph), gpu=get_gpu(gpu)))
    efficiency = nccl_link_efficiency(graph, DEFAULT, Fabric.from_topology(graph))  # as the engine derates
    return env, FlowNetwork(env, graph, seed=0, link_efficiency=efficiency), ctx


def test_link_tokens_are_the_per_rank_bytes_deepep_charges():
    d = draw_copies(RoutingConfig("zipf", 1.2, sampled=True), 256, 32, 128 * 8, 0, 0, top_k=8)
    for mode in ("normal", "low_latency"):
        t = link_tokens(mode, d.pair_tokens, 128, 8, 8)
        for pairs, rank in ((t.nvlink, t.nvlink_rank), (t.rdma, t.rdma_rank)):
            assert np.allclose(np.maximum(pairs.sum(axis=1), pairs.sum(axis=0)), rank, rtol=1e-12)
        assert np.all(np.diag(t.nvlink) == 0)
    normal = link_tokens("normal", d.pair_tokens, 128, 8, 8)
    same_rail = (np.arange(32)[:, None] % 8) == (np.arange(32)[None, :] % 8)
    assert np.all(normal.rdma[~same_rail] == 0)  # RDMA only along a rail, NVLink only inside a node
    same_node = (np.arange(32)[:, None] // 8) == (np.arange(32)[None, :] // 8)
    assert np.all(normal.nvlink[~same_node] == 0)


@pytest.mark.parametrize(("gpu", "nodes"), [("h800", 1), ("h800", 2), ("h100-sxm", 4)])
def test_deepep_flows_on_an_idle_fabric_take_the_proxys_deepep_price(gpu, nodes):
    graph = build_topology(f"{gpu.split('-')[0]}-ib-rail", num_nodes=nodes)
    ranks = [f"gpu{k}" for k in range(8 * nodes)]
    for mode, tokens in (("normal", 4096), ("low_latency", 128)):
        d = draw_copies(RoutingConfig(), 256, len(ranks), tokens * 8, 0, 0, top_k=8)
        env, network, ctx = _idle_network(graph, gpu)
        ex = exchange(ctx, graph, ranks, d.pair_tokens, mode, tokens, 8, 7392.0)
        proxy = float(uniform_time_s(mode, tokens, 8, 7392.0, len(ranks), 8, get_gpu(gpu)))
        assert ex.time_s == pytest.approx(proxy, rel=1e-9)
        proc = env.process(run_exchange(env, network, ex))
        env.run(until=proc)
        assert proc.value == pytest.approx(proxy, rel=0.01), (mode, nodes)  # cross-rail writes spread over spines


def test_deepep_flows_slow_down_when_another_transfer_shares_the_busiest_link():
    graph = build_topology("h800-ib-rail", num_nodes=4)  # RDMA-bound: 3 of 4 nodes' shares cross the NIC
    ranks = [f"gpu{k}" for k in range(32)]
    d = draw_copies(RoutingConfig(), 256, 32, 4096 * 8, 0, 0, top_k=8)
    times = []
    for competing in (False, True):
        env, network, ctx = _idle_network(graph, "h800")
        ex = exchange(ctx, graph, ranks, d.pair_tokens, "normal", 4096, 8, 7392.0)
        proc = env.process(run_exchange(env, network, ex))
        if competing:  # long transfers from gpu0 to its rail peers: as many flows on its NIC as DeepEP's
            for peer in ("gpu8", "gpu16", "gpu24"):
                network.transfer("gpu0", peer, 1e9)
        env.run(until=proc)
        times.append(proc.value)
    assert times[0] == pytest.approx(ex.time_s, rel=1e-6)
    assert times[1] > 1.3 * times[0]  # max-min fair: half the NIC where DeepEP needs 3/4


@pytest.mark.parametrize(("phase", "s", "alone"), [
    ("decode", Strategy(tp=1, ep=16, pp=1, dp=2, batch=512), True),  # two EP groups share spines: flows
    ("prefill", Strategy(tp=1, ep=16, pp=1, dp=2, batch=16), True),
    pytest.param("decode", Strategy(tp=1, ep=16, pp=2, dp=1, batch=512, microbatches=2), False,  # pipeline sends
                 marks=pytest.mark.slow),                                                      # share NICs
])
def test_engine_exchange_equals_the_proxys_deepep_formula_under_uniform_routing(phase, s, alone):
    ctx = _ctx(phase, 32)
    graph = build_topology("h100-ib-rail", num_nodes=4)
    mode = "normal" if phase == "prefill" else "low_latency"
    tokens = s.batch / (s.ep * s.microbatches) * (512 if phase == "prefill" else 1)
    lowered = {op.name: op for op in build_programs(ctx, s, phase)[0].ops if op.name in ("dispatch", "combine")}
    h = ctx.model.hidden_size
    for name, op in lowered.items():  # the proxy's price is DeepEP's closed form for these bytes
        per_copy = op.size_bytes / (tokens * 8) * (fp8_token_bytes(h) / h if name == "dispatch" else 1.0)
        assert token_bytes(ctx, name, op.size_bytes / (tokens * 8)) == pytest.approx(per_copy)
        assert op.duration_s == pytest.approx(float(uniform_time_s(mode, tokens, 8, per_copy, 16, 8, ctx.cluster.gpu)),
                                              rel=1e-9)
    flows = 0
    for kw in ({}, {"mode": "per-gpu"}, {"mode": "per-gpu", "contention": False}, {"mode": "folded"}):
        times, run = _exchange_times(ctx, graph, s, EngineConfig(routing=DEEPEP, **kw), phase)
        flows += run.flows_run
        for name, op in lowered.items():
            assert times[name] and min(times[name]) == pytest.approx(op.duration_s, rel=0.01), (kw, name)
            if alone or kw.get("contention") is False:  # no other traffic: every exchange at DeepEP's price
                assert max(times[name]) == pytest.approx(op.duration_s, rel=0.01), (kw, name)
            else:  # a pipeline send on its links may slow it, never speed it up
                assert max(times[name]) >= op.duration_s * (1 - 1e-9), (kw, name)
    assert flows > 0  # some ran as DeepEP's flows, not only as its idle-fabric time


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_skewed_routing_slows_the_deepep_exchange_to_its_slowest_rank(phase):
    ctx = _ctx(phase, 16, SKEW)
    graph = build_topology("h100-ib-rail", num_nodes=2)
    s = Strategy(tp=1, ep=16, pp=1, dp=1, batch=512 if phase == "decode" else 16)
    cfg = EngineConfig(routing=SKEW, mode="per-gpu")
    skewed, _ = _exchange_times(ctx, graph, s, cfg, phase)
    flat, _ = _exchange_times(_ctx(phase, 16), graph, s, EngineConfig(routing=DEEPEP, mode="per-gpu"), phase)
    tokens = s.batch / s.ep * (512 if phase == "prefill" else 1)
    # layer 0's dispatch is DeepEP's per-rank formula on the engine's own draw, its slowest rank
    from simcore.engine.moework import RankPrograms

    work = RankPrograms(ctx, s, phase, None, cfg)
    per_copy = token_bytes(ctx, "dispatch", work.bytes_per_copy("dispatch"))
    mode = "normal" if phase == "prefill" else "low_latency"
    first_moe = min(work._moe_index)
    expected = pair_times_s(mode, work.work(first_moe, 0).pair_tokens, tokens, 8, per_copy, 8, ctx.cluster.gpu).max()
    layer0 = [iv for iv in run_per_gpu(ctx, graph, s, cfg, phase).intervals
              if iv.name == "dispatch" and iv.layer == first_moe and iv.step == 0]
    assert layer0[0].end - layer0[0].start == pytest.approx(expected, rel=1e-6)
    for name in ("dispatch", "combine"):
        assert np.mean(skewed[name]) > 1.001 * np.mean(flat[name]), name
        assert max(skewed[name]) > max(flat[name])


def test_deepep_simulator_equals_proxy_without_contention_and_overlap():
    graph = build_topology("h100-ib-rail", num_nodes=2)
    off = EngineConfig(contention=False, overlap=False, routing=DEEPEP)
    for phase, s in (("decode", Strategy(tp=1, ep=16, pp=1, dp=1, batch=256)),
                     ("prefill", Strategy(tp=2, ep=8, pp=1, dp=1, batch=8)),
                     ("decode", Strategy(tp=1, ep=8, pp=2, dp=1, batch=256, microbatches=2))):
        ctx = _ctx(phase, 16)
        proxy = evaluate(ctx, s)
        assert proxy.valid, proxy.reasons
        for mode in ("auto", "per-gpu"):
            sim = simulate(ctx, graph, s, dataclasses.replace(off, mode=mode))
            assert sim.step_time_s == pytest.approx(proxy.step_time_s, rel=0.01), (phase, s, mode)


def test_deepep_folded_equals_per_gpu_where_auto_folds():
    graph = build_topology("h100-ib-rail", num_nodes=2)
    folds = 0
    for phase, s in (("decode", Strategy(tp=1, ep=16, pp=1, dp=1, batch=256)),
                     ("decode", Strategy(tp=2, ep=8, pp=1, dp=1, batch=256)),
                     ("prefill", Strategy(tp=1, ep=8, pp=1, dp=2, batch=8)),
                     ("prefill", Strategy(tp=1, ep=8, pp=2, dp=1, batch=8, microbatches=2))):
        ctx = _ctx(phase, 16)
        for placement in ("pack", "spread"):
            auto = simulate(ctx, graph, s, EngineConfig(routing=DEEPEP, placement=placement))
            if auto.mode != "folded":
                continue
            folds += 1
            ref = simulate(ctx, graph, s, EngineConfig(routing=DEEPEP, placement=placement, mode="per-gpu",
                                                       share_lanes=False))
            assert auto.step_time_s == pytest.approx(ref.step_time_s, rel=0.01), (phase, s, placement)
    assert folds > 0
