"""The roofline proxy: physical limits, hand-computable cases, batch == scalar, validity reasons."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.cost.lowering import StrategyArrays, lower
from simcore.cost.proxy import evaluate, evaluate_batch
from simcore.strategy import layout as L
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS
from simcore.strategy.sharding import Strategy, megatron_strategy
from tests.conftest import make_ctx

SCENARIOS = [
    ("llama-3.1-70b", 8, "decode"), ("llama-3.1-70b", 8, "prefill"), ("mixtral-8x22b", 16, "decode"),
    ("deepseek-v3", 64, "decode"), ("llama-3.1-8b", 8, "static"), ("mixtral-8x7b", 16, "static"),
]


def random_strategy(draw_int, gpus: int, moe: bool) -> Strategy:
    tp = 2 ** draw_int(0, 3)
    ep = 2 ** draw_int(0, 3) if moe else 1
    pp = 2 ** draw_int(0, 2)
    dp = max(1, gpus // (tp * ep * pp))
    sharding = {op: CHOICES[draw_int(0, 2)] for op in SEARCHABLE_OPS}
    return Strategy(tp=tp, ep=ep, pp=pp, dp=dp, batch=2 ** draw_int(0, 9), microbatches=2 ** draw_int(0, 2),
                    sharding=sharding)


def _rng_strategies(ctx, n, seed=0):
    rng = np.random.default_rng(seed)
    return [random_strategy(lambda a, b: int(rng.integers(a, b + 1)), ctx.cluster.num_gpus, ctx.model.is_moe)
            for _ in range(n)]


@pytest.mark.parametrize(("model", "gpus", "phase"), SCENARIOS)
def test_batch_equals_scalar(model, gpus, phase):
    ctx = make_ctx(model, gpus, phase, input_len=1024, output_len=64)
    strategies = _rng_strategies(ctx, 60)
    batch = evaluate_batch(ctx, strategies)
    for i, s in enumerate(strategies):
        one = evaluate(ctx, s)
        assert one.step_time_s == pytest.approx(batch.step_time_s[i], rel=1e-9)
        assert one.tokens_per_s_per_gpu == pytest.approx(batch.tokens_per_s_per_gpu[i], rel=1e-9)
        assert one.valid == bool(batch.valid[i])
        # the breakdown accounts for the whole step
        assert sum(one.by_category.values()) == pytest.approx(one.step_time_s, rel=1e-9)


def _decode_bound_tokens_per_s(ctx, s: Strategy) -> float:
    """Streaming the active weights once plus every sequence's KV cache from HBM at peak bandwidth."""
    m, w, gpu = ctx.model, ctx.workload, ctx.cluster.gpu
    weights = m.active_params() * w.weight_bytes
    kv = s.batch * w.input_len * m.kv_cache_elements_per_token() * w.kv_bytes
    replica_gpus = s.tp * s.ep * s.pp
    step = (weights + kv) / (replica_gpus * gpu.hbm_bandwidth_bytes_per_s)
    return s.dp * s.batch / step


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), scenario=st.sampled_from(SCENARIOS[:4]))
def test_physical_limits_and_finiteness(data, scenario):
    model, gpus, phase = scenario
    ctx = make_ctx(model, gpus, phase)
    s = random_strategy(lambda a, b: data.draw(st.integers(a, b)), gpus, ctx.model.is_moe)
    r = evaluate(ctx, s)
    assert np.isfinite(r.step_time_s) and r.step_time_s > 0
    assert np.isfinite(r.memory_per_gpu_bytes) and r.memory_per_gpu_bytes > 0
    assert np.isfinite(r.tokens_per_s) and r.tokens_per_s > 0
    assert r.valid == (r.reasons == [])
    if phase == "decode":
        assert r.tokens_per_s <= _decode_bound_tokens_per_s(ctx, s) * (1 + 1e-9)
    else:
        m = ctx.model
        flops_per_token = 2.0 * (m.active_params() - m.embedding_params())
        peak = s.gpus * ctx.cluster.gpu.peak_flops_per_s[ctx.workload.precision]
        assert r.tokens_per_s <= peak / flops_per_token


def test_single_gpu_decode_is_weight_streaming_plus_launches():
    ctx = make_ctx("llama-3.1-8b", 1, "decode", input_len=128)
    r = evaluate(ctx, Strategy(batch=1))
    gpu, m = ctx.cluster.gpu, ctx.model
    # the embedding table is not streamed: only the looked-up rows are read
    stream = (m.total_params() - m.embedding_params()) * 2 / (gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency)
    kernels = m.num_layers * 7 + 3  # qkv, attention, out_proj, ffn1, ffn2, 2 norms; embedding, head
    expected = stream + kernels * gpu.kernel_overhead_s + gpu.iteration_overhead_s
    assert r.step_time_s == pytest.approx(expected, rel=0.05)
    assert r.by_category.get("comm:tp", 0.0) == 0.0


def test_megatron_tp8_decode_issues_two_all_reduces_per_layer():
    ctx = make_ctx("llama-3.1-70b", 8, "decode")
    s = StrategyArrays.from_strategies([megatron_strategy(tp=8, batch=16)])
    blocks = lower(ctx, s, "decode")
    layer_colls = [int(t.extra["collective"][0]) for t in blocks["dense_layer"] if t.is_comm]
    assert sorted(c for c in layer_colls if c != L.NONE) == [L.ALL_REDUCE, L.ALL_REDUCE]
    head = [int(t.extra["collective"][0]) for t in blocks["last"] if t.is_comm]
    assert [c for c in head if c != L.NONE] == [L.ALL_GATHER]  # (value, id) per rank for sampling


def test_invalid_strategies_carry_reasons():
    ctx = make_ctx("llama-3.1-70b", 8, "decode", tpot_slo_s=1e-6)
    assert "device_count" in evaluate(ctx, megatron_strategy(tp=4, batch=8)).reasons
    assert "hbm_capacity" in evaluate(ctx, megatron_strategy(tp=1, dp=8, batch=8)).reasons
    assert "tpot_slo" in evaluate(ctx, megatron_strategy(tp=8, batch=8)).reasons
    assert "experts_divisibility" in evaluate(ctx, megatron_strategy(tp=4, ep=2, batch=8)).reasons
    ctx_h = make_ctx("falcon-180b", 16, "decode")  # 232 heads do not split 16 ways
    assert "heads_divisibility" in evaluate(ctx_h, megatron_strategy(tp=16, batch=16)).reasons
    assert "heads_divisibility" not in evaluate(ctx_h, megatron_strategy(tp=8, dp=2, batch=16)).reasons
    assert "batch_divisibility" in evaluate(ctx, megatron_strategy(tp=4, pp=2, batch=3, microbatches=2)).reasons


def test_groups_that_straddle_nvlink_domains_unevenly_are_invalid():
    from simcore.cost.cluster import Cluster
    from simcore.cost.lowering import CostContext

    base = make_ctx("deepseek-v3", 144)
    ctx = CostContext(base.model, base.workload, Cluster.simple("h100-sxm", 144, nvlink_domain_size=72))
    straddles = [megatron_strategy(tp=8, ep=2, dp=9, batch=72),    # EP blocks of 16 GPUs in 72-GPU domains
                 megatron_strategy(tp=16, dp=9, batch=72)]          # TP groups of 16
    fine = [megatron_strategy(tp=8, ep=9, dp=2, batch=72),          # EP blocks of 72 fill a domain
            megatron_strategy(tp=4, ep=2, dp=18, batch=72),         # blocks of 8 tile a domain
            megatron_strategy(tp=8, ep=18, batch=72)]               # EP blocks of 144 cover two domains
    assert all("domain_straddle" in evaluate(ctx, s).reasons for s in straddles)
    assert not any("domain_straddle" in evaluate(ctx, s).reasons for s in fine)
    h100 = make_ctx("deepseek-v3", 64)
    assert "domain_straddle" not in evaluate(h100, megatron_strategy(tp=8, ep=8, batch=64)).reasons


def test_static_midpoint_rule_error_is_small():
    ctx = make_ctx("llama-3.1-8b", 8, "static", input_len=512, output_len=256)
    strategies = _rng_strategies(ctx, 40, seed=3)
    r = evaluate_batch(ctx, strategies)
    dec = make_ctx("llama-3.1-8b", 8, "decode", input_len=512)
    s = StrategyArrays.from_strategies(strategies)
    exact = sum(evaluate_batch(make_ctx("llama-3.1-8b", 8, "decode", input_len=512 + i), s).step_time_s
                for i in range(256))
    assert dec.workload.input_len == 512
    decode_part = r.step_time_s - r.ttft_s
    assert np.max(np.abs(decode_part / exact - 1)) < 0.01


def test_more_context_never_speeds_up_decode():
    short, long = make_ctx(input_len=1024), make_ctx(input_len=8192)
    strategies = _rng_strategies(short, 50, seed=5)
    assert np.all(evaluate_batch(long, strategies).step_time_s >= evaluate_batch(short, strategies).step_time_s)
