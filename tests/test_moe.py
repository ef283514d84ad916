"""MoE routing draws, expert placement, the proxy's expected skew, DeepEP costs, redundant experts."""

import dataclasses
import json

import numpy as np
import pytest

from simcore.cost.lowering import StrategyArrays
from simcore.cost.memory import memory_per_gpu_bytes, reason_names, redundant_fit_error
from simcore.cost.proxy import evaluate, evaluate_batch
from simcore.hardware.gpus import get_gpu
from simcore.models import get_model
from simcore.moe import (
    DEFAULT_DEEPEP,
    RoutingConfig,
    draw_routing,
    expected_max_load,
    pair_times_s,
    place_experts,
    slots_per_rank,
    uniform_time_s,
)
from simcore.strategy.sharding import Strategy
from tests.conftest import make_ctx

DSV3 = get_model("deepseek-v3")
ZIPF = RoutingConfig("zipf", 1.0, sampled=True)


def test_draws_are_seeded_and_independent_of_call_order():
    a = draw_routing(ZIPF, DSV3, 16, 64, seed=7, layer=3, step=2)
    draw_routing(ZIPF, DSV3, 16, 64, seed=7, layer=5, step=0)  # another draw in between
    b = draw_routing(ZIPF, DSV3, 16, 64, seed=7, layer=3, step=2)
    assert np.array_equal(a.pair_tokens, b.pair_tokens)
    c = draw_routing(ZIPF, DSV3, 16, 64, seed=7, layer=3, step=3)
    d = draw_routing(ZIPF, DSV3, 16, 64, seed=8, layer=3, step=2)
    assert not np.array_equal(a.pair_tokens, c.pair_tokens) and not np.array_equal(a.pair_tokens, d.pair_tokens)


@pytest.mark.parametrize("cfg", [RoutingConfig(), ZIPF, RoutingConfig("zipf", 1.2)])
@pytest.mark.parametrize("redundant", [0, 32])
def test_token_copies_are_conserved(cfg, redundant):
    ep, tokens = 32, 48
    d = draw_routing(cfg, DSV3, ep, tokens, seed=1, layer=0, step=0, redundant=redundant)
    total = ep * tokens * DSV3.top_k
    assert d.pair_tokens.shape == (ep, ep)
    assert d.pair_tokens.sum() == pytest.approx(total)
    assert d.pair_tokens.sum(axis=1) == pytest.approx(np.full(ep, tokens * DSV3.top_k))  # each sends its own
    assert d.rank_tokens == pytest.approx(d.pair_tokens.sum(axis=0))
    assert d.expert_tokens.sum() == pytest.approx(total)
    assert len(d.expert_tokens) == ep * slots_per_rank(256, ep, redundant)
    assert np.all(d.expert_tokens[d.slot_expert < 0] == 0)  # empty slots get nothing


def test_uniform_routing_is_balanced():
    d = draw_routing(RoutingConfig(), DSV3, 64, 128, seed=0, layer=0)
    assert d.max_load == pytest.approx(1.0)
    sampled = draw_routing(RoutingConfig(sampled=True), DSV3, 8, 4096, seed=0, layer=0)
    assert 1.0 < sampled.max_load < 1.05  # only multinomial noise at 32k copies per rank
    assert expected_max_load(RoutingConfig(), 256, 64, 1e4) == 1.0


def test_zipf_skew_raises_the_max_and_replicas_lower_it():
    loads = [expected_max_load(RoutingConfig("zipf", s), 256, 32, 1e5) for s in (0.0, 0.5, 1.0, 1.5)]
    assert loads[0] == pytest.approx(1.0)
    assert all(b > a for a, b in zip(loads, loads[1:], strict=False))
    cfg = RoutingConfig("zipf", 1.0)
    with_replicas = [expected_max_load(cfg, 256, 32, 1e5, redundant=n) for n in (0, 8, 32, 64)]
    assert all(b < a for a, b in zip(with_replicas, with_replicas[1:], strict=False))
    assert with_replicas[-1] < 0.5 * with_replicas[0]


def test_redundant_placement_splits_hot_experts_and_never_hurts():
    p = 1.0 / np.arange(1, 17) ** 1.2
    p /= p.sum()
    static, eplb = place_experts(p, 8), place_experts(p, 8, redundant=8)
    assert eplb.replicas[0] > 1 and eplb.max_load < static.max_load
    assert eplb.slot_share.sum() == pytest.approx(1.0)
    for r in range(8):  # no expert twice on one rank
        held = eplb.slot_expert[r][eplb.slot_expert[r] >= 0]
        assert len(set(held.tolist())) == len(held)
    uniform = np.full(8, 1 / 8)  # balanced already: a replica would only add load somewhere
    assert place_experts(uniform, 8, redundant=1).max_load == pytest.approx(1.0)


@pytest.mark.parametrize(("cfg", "ep", "tokens", "redundant"), [
    (RoutingConfig("zipf", 1.0, sampled=True), 16, 64, 0),
    (RoutingConfig("zipf", 0.6, sampled=True), 32, 16, 16),
    (RoutingConfig(sampled=True), 64, 8, 0),
    (RoutingConfig("zipf", 1.2), 8, 128, 8),
])
def test_expected_max_load_matches_monte_carlo(cfg, ep, tokens, redundant):
    draws = [draw_routing(cfg, DSV3, ep, tokens, seed=s, layer=layer, step=step, redundant=redundant).max_load
             for s in range(4) for layer in range(25) for step in range(2)]
    expected = expected_max_load(cfg, 256, ep, ep * tokens * DSV3.top_k, redundant)
    assert expected == pytest.approx(np.mean(draws), rel=0.04)


def test_load_file_csv_and_json(tmp_path):
    loads = np.arange(1, 9, dtype=float)[None, :].repeat(3, axis=0)
    loads[1] = loads[1][::-1]
    csv_path = tmp_path / "loads.csv"
    csv_path.write_text("layer,expert,load\n" + "".join(f"{la},{e},{loads[la, e]}\n" for la in range(3) for e in range(8)))
    json_path = tmp_path / "loads.json"
    json_path.write_text(json.dumps({"loads": loads.tolist()}))
    mixtral = get_model("mixtral-8x7b")
    for path in (csv_path, json_path):
        cfg = RoutingConfig("file", path=str(path))
        d = draw_routing(cfg, mixtral, 8, 100, seed=0, layer=1)
        assert d.rank_tokens == pytest.approx(800 * 2 * loads[1] / loads[1].sum())
        assert draw_routing(cfg, mixtral, 8, 100, seed=0, layer=4).rank_tokens == pytest.approx(d.rank_tokens)


def test_bad_routing_input_is_rejected_with_the_field(tmp_path):
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([[1.0] * 7]))
    with pytest.raises(ValueError, match=r"routing\.path: .* 7 experts per layer, the model has 8"):
        draw_routing(RoutingConfig("file", path=str(wrong)), get_model("mixtral-8x7b"), 8, 10, 0, 0)
    negative = tmp_path / "negative.csv"
    negative.write_text("layer,expert,load\n0,0,1\n0,1,-2\n")
    with pytest.raises(ValueError, match=r"routing\.path: negative .* expert 1"):
        expected_max_load(RoutingConfig("file", path=str(negative)), 2, 2, 100)
    with pytest.raises(ValueError, match=r"routing\.path: no such file"):
        expected_max_load(RoutingConfig("file", path=str(tmp_path / "none.csv")), 8, 2, 100)
    with pytest.raises(ValueError, match=r"routing\.distribution"):
        RoutingConfig("pareto")
    with pytest.raises(ValueError, match=r"routing\.a2a"):
        RoutingConfig(a2a="mpi")
    with pytest.raises(ValueError, match=r"strategy\.redundant_experts"):
        Strategy(redundant_experts=-1)


def test_deepep_pair_costs_equal_the_uniform_closed_form():
    gpu = get_gpu("h100-sxm")
    for ep, rpn in ((8, 8), (32, 8), (64, 4)):
        d = draw_routing(RoutingConfig(), DSV3, ep, 128, seed=0, layer=0)
        for mode in ("normal", "low_latency"):
            pair = pair_times_s(mode, d.pair_tokens, 128, 8, 7392.0, rpn, gpu).max()
            assert pair == pytest.approx(float(uniform_time_s(mode, 128, 8, 7392.0, ep, rpn, gpu)), rel=1e-9)


def test_deepep_hand_computable_and_skew_slows_the_busiest_rank():
    gpu = get_gpu("h800")
    c = DEFAULT_DEEPEP
    # low latency over RDMA only (2 nodes x 1 rank): 1024 copies, half cross the NIC each way
    t = float(uniform_time_s("low_latency", 128, 8, 7392.0, 2, 1, gpu))
    expected = c.ll_latency_s + c.ll_per_peer_s + 512 * 7392.0 / (c.ll_rdma_efficiency * gpu.nic_bandwidth_bytes_per_s)
    assert t == pytest.approx(expected)
    hot = draw_routing(RoutingConfig("zipf", 1.2), DSV3, 16, 128, seed=0, layer=0)
    flat = draw_routing(RoutingConfig(), DSV3, 16, 128, seed=0, layer=0)
    for mode in ("normal", "low_latency"):
        assert (pair_times_s(mode, hot.pair_tokens, 128, 8, 7392.0, 8, gpu).max()
                > pair_times_s(mode, flat.pair_tokens, 128, 8, 7392.0, 8, gpu).max())


def test_proxy_prices_skew_and_replicas_only_when_routing_is_configured():
    ctx = make_ctx("deepseek-v3", 64, "decode", precision="fp8")
    s = Strategy(tp=1, ep=64, pp=1, dp=1, batch=1024)
    base = evaluate(ctx, s).step_time_s
    uniform = dataclasses.replace(ctx, routing=RoutingConfig())
    assert evaluate(uniform, s).step_time_s == base
    skewed = dataclasses.replace(ctx, routing=RoutingConfig("zipf", 0.8))
    hot = evaluate(skewed, s).step_time_s
    balanced = evaluate(skewed, s.replace(redundant_experts=64)).step_time_s
    assert hot > 1.5 * base and balanced < 1.1 * base  # replicas buy most of the skew back
    batch = evaluate_batch(skewed, [s, s.replace(redundant_experts=64)])
    assert batch.step_time_s == pytest.approx([hot, balanced], rel=1e-9)
    deepep = evaluate(dataclasses.replace(ctx, routing=RoutingConfig(a2a="deepep")), s)
    assert deepep.step_time_s != base and deepep.by_operator["expert_ffn1"] > 0


def test_redundant_experts_cost_memory_and_are_checked():
    ctx = make_ctx("deepseek-v3", 64, "decode", precision="fp8")
    s = Strategy(tp=1, ep=64, pp=1, dp=1, batch=64)
    mem = memory_per_gpu_bytes(ctx, StrategyArrays.from_strategies([s, s.replace(redundant_experts=64)]))
    expert = 3 * 7168 * 2048 * DSV3.num_moe_layers  # one FP8 expert slot over all MoE layers
    assert mem[1] - mem[0] == pytest.approx(expert, rel=1e-6)
    assert redundant_fit_error(ctx, s.replace(redundant_experts=64)) is None
    message = redundant_fit_error(ctx, s.replace(redundant_experts=2000))
    assert message.startswith("strategy.redundant_experts=2000:") and "\n" not in message
    too_many = evaluate_batch(ctx, [Strategy(tp=8, ep=1, pp=1, dp=8, batch=64, redundant_experts=4)])
    assert "redundant_experts" in reason_names(int(too_many.reasons[0]))
    assert Strategy.from_yaml(s.replace(redundant_experts=3).to_yaml()).redundant_experts == 3
    assert "redundant_experts" not in s.to_dict()  # old plans keep their form


def _shard_sim(tmp_path, *overrides):
    import subprocess
    import sys

    code = "import sys; from planner.apps.sim import main; sys.argv = ['shard-sim'] + sys.argv[1:]; main()"
    return subprocess.run([sys.executable, "-c", code, "experiment=deepseek-8node", f"hydra.run.dir={tmp_path}",
                           *overrides], capture_output=True, text=True, timeout=300)


def test_shard_sim_rejects_replicas_beyond_hbm_and_bad_load_files(tmp_path):
    r = _shard_sim(tmp_path, "strategy.ep=64", "strategy.batch=64", "strategy.redundant_experts=2000")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: strategy.redundant_experts=2000") and len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "loads.json"
    bad.write_text(json.dumps([[1.0] * 255]))
    r = _shard_sim(tmp_path, "strategy.ep=64", "strategy.batch=64", "sim.routing.distribution=file",
                   f"sim.routing.path={bad}")
    assert r.returncode == 2 and "error: routing.path:" in r.stderr and "255 experts" in r.stderr


def test_moe_study_reports_fit_and_test_errors_per_ep(tmp_path):
    from validation.studies import moe

    data = tmp_path / "rows.csv"
    from pathlib import Path

    lines = (Path(__file__).parents[1] / "validation/data/ep_alltoall_deepep.csv").read_text().splitlines()
    data.write_text("\n".join(lines + [lines[-1].replace("elastic (unified)", "intranode").replace("SM90", "B300")]))
    out = moe.run(data, tmp_path / "out")
    assert out["rows_used"] == 38 and out["rows_skipped"] == 5  # 4 elastic-kernel rows, 1 unknown GPU
    assert out["fit"]["median_abs_error"] < 0.03 and out["test"]["rows"] == 18
    assert {"fit/normal/ep8", "fit/low_latency/ep256", "test/low_latency/ep8"} <= set(out["median_abs_error_by_ep"])
    assert (tmp_path / "out" / "moe_errors.png").stat().st_size > 0
    cases, _ = moe.load_cases(data)
    pure = next(c for c in cases if c.mode == "low_latency" and c.split == "fit")
    assert not pure.ll_nvlink and pure.gpu == "h800"
