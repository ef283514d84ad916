"""SGLang's admission headroom (simcore.serving.headroom): the KV kept for running requests' future tokens."""

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import (
    LengthDist,
    ServingConfig,
    ServingPlan,
    get_runtime,
    runtime_strategy,
    simulate_serving,
)
from simcore.serving import headroom as H
from simcore.serving.kvcache import KvCache
from simcore.serving.requests import Request
from simcore.serving.scheduler import GroupScheduler
from simcore.workload import Workload


def _req(rid, isl, osl, generated=0):
    r = Request(rid=rid, arrival_s=0.0, input_len=isl, output_len=osl)
    if generated:
        r.kv_tokens, r.generated = isl + generated - 1, generated
    return r


def test_the_ratio_decays_to_its_floor_and_restarts_when_idle():
    t = H.NewTokenRatio()
    assert (t.current, t.min) == (pytest.approx(0.7), pytest.approx(0.098))
    one_by_one = H.NewTokenRatio()
    for _ in range(250):
        one_by_one.decode_steps(1)
    t.decode_steps(250)
    assert t.current == pytest.approx(one_by_one.current)
    assert t.current == pytest.approx(0.7 - 250 * (0.7 - 0.098) / 600)
    t.decode_steps(10_000)
    assert t.current == pytest.approx(0.098)
    t.reset()
    assert t.current == pytest.approx(0.7)


def test_after_a_retraction_the_ratio_is_sglangs_estimate():
    t = H.NewTokenRatio()
    running = [_req(0, 100, 1000, generated=300), _req(1, 100, 1000, generated=100)]
    t.after_retract(running)
    assert t.current == pytest.approx((400 + 20 * 2) / 2000)
    t.after_retract([_req(2, 100, 10, generated=9)])
    assert t.current == 1.0  # clamped


def _group(reserve: bool, capacity=10_000):
    return GroupScheduler("sglang", KvCache(capacity, 1), max_num_seqs=64, max_tokens=8192, reserve_output=reserve)


def test_a_prompt_that_fits_is_held_back_while_running_requests_may_still_need_the_kv():
    # 4 running requests, 2000 tokens each held, 3000 still to generate: 2000 free, 0.7 x 4 x 3000 reserved
    for reserve, admitted in ((False, True), (True, False)):
        g = _group(reserve)
        for i in range(4):
            r = _req(i, 1000, 4000, generated=1000)
            assert g.kv.grow(r, r.kv_tokens)
            g.running.append(r)
        g.add(_req(9, 500, 500))
        picks = g.schedule(set())
        assert any(r.rid == 9 for r, _ in picks) is admitted
        if not admitted:  # the step decodes the running requests instead, and the estimate decays
            assert len(picks) == 4 and g.headroom.current < 0.7


def test_the_headroom_refuses_nobody_when_kv_is_ample():
    g = _group(True, capacity=10**7)
    for i in range(4):
        r = _req(i, 1000, 4000, generated=10)
        g.kv.grow(r, r.kv_tokens)
        g.running.append(r)
    for j in range(3):
        g.add(_req(10 + j, 1000, 1000))
    picks = g.schedule(set())
    assert sorted(r.rid for r, _ in picks) == [10, 11, 12]


def _tight(runtime="sglang", mem_fraction=0.16):
    ctx = CostContext(get_model("llama-3.1-8b"), Workload(precision="bf16"), Cluster.simple("h200", 8))
    rt = get_runtime(runtime).with_overrides(mem_fraction=mem_fraction)  # ~ 90k KV tokens of 1 GPU
    cfg = ServingConfig(concurrency=96, num_requests=300, runtime=runtime, seed=7,
                        input_len=LengthDist("uniform", mean=1000, low=800, high=1200),
                        output_len=LengthDist("uniform", mean=1500, low=1000, high=2000))
    return ctx, rt, cfg


def test_under_short_kv_sglang_retracts_less_than_a_scheduler_without_headroom(monkeypatch):
    ctx, rt, cfg = _tight()
    plan = ServingPlan.aggregated(runtime_strategy(tp=1), workers=1, max_num_seqs=96)
    with_headroom = simulate_serving(ctx, plan, cfg, runtime=rt)
    import simcore.serving.scheduler as S

    monkeypatch.setattr(S, "NewTokenRatio", lambda: None)
    without = simulate_serving(ctx, plan, cfg, runtime=rt)
    assert with_headroom.feasible and without.feasible
    assert without.metrics.preemptions > 0
    assert with_headroom.metrics.preemptions < without.metrics.preemptions / 2


@pytest.mark.parametrize("tp_ep", [(1, 1), (2, 2)])
def test_fast_path_equals_reference_when_the_headroom_binds(tp_ep):
    """Folded decode runs apply the ratio's decay in closed form (and the idle reset of an attention-DP
    group with nothing to decode): equal to step by step."""
    tp, ep = tp_ep
    model = "llama-3.1-8b" if ep == 1 else "qwen3-30b-a3b"
    ctx = CostContext(get_model(model), Workload(precision="bf16"), Cluster.simple("h200", 8))
    rt = get_runtime("sglang").with_overrides(mem_fraction=0.16 if ep == 1 else 0.25)
    plan = ServingPlan.aggregated(runtime_strategy(tp=tp, ep=ep), workers=1, max_num_seqs=64)
    cfg = ServingConfig(concurrency=48, num_requests=120, runtime="sglang", seed=11,
                        input_len=LengthDist("uniform", mean=1000, low=800, high=1200),
                        output_len=LengthDist("uniform", mean=1200, low=400, high=2000))
    fast = simulate_serving(ctx, plan, cfg, runtime=rt, fast=True)
    slow = simulate_serving(ctx, plan, cfg, runtime=rt, fast=False)
    assert fast.feasible and slow.feasible
    key = [(r.steps, r.metrics.requests, r.metrics.preemptions, r.metrics.ttft_s["mean"], r.metrics.tpot_s["mean"])
           for r in (fast, slow)]
    assert key[0] == pytest.approx(key[1], rel=1e-9)


def test_sglangs_default_static_fraction_is_its_own_heuristic():
    """ServerArgs._handle_gpu_memory_settings by hand: H100 (81,559 MiB), TP 1: 512 + 1.5 x 8192 + 2 x 256
    + 1024 / 8 = 13,440 MiB reserved; H200 (143,771 MiB), TP 8: 512 + 12,288 + 1,024 + 1,024 = 14,848."""
    from simcore.hardware.gpus import get_gpu
    from simcore.serving.kvcache import sglang_mem_fraction

    rt = get_runtime("sglang")
    assert rt.mem_fraction is None and rt.mem_fraction_static
    assert sglang_mem_fraction(get_gpu("h100-sxm"), runtime_strategy(tp=1), rt) == round(1 - 13440 / 81559, 3)
    assert sglang_mem_fraction(get_gpu("h200"), runtime_strategy(tp=8), rt) == round(1 - 14848 / 143771, 3)
    # DP attention reserves 4.5 x the graph limit per rank more (512 graph batch at width 8)
    dp = sglang_mem_fraction(get_gpu("h200"), runtime_strategy(tp=1, ep=8), rt)
    assert dp == round(1 - (14848 + 512 * 8 * 4.5) / 143771, 3)


def test_sglangs_static_pool_holds_weights_and_kv_only():
    """Weights plus KV fill the static fraction exactly; activations live outside it. A vLLM-style fraction
    (activations inside) leaves less KV at the same number."""
    from simcore.serving.kvcache import kv_bytes_per_token, kv_capacity_tokens

    ctx = CostContext(get_model("llama-3.1-70b"), Workload(precision="fp8"), Cluster.simple("h100-sxm", 8))
    strategy = runtime_strategy(tp=4)
    static = get_runtime("sglang").with_overrides(mem_fraction=0.85)
    inside = static.with_overrides(mem_fraction_static=False)
    per_token = kv_bytes_per_token(ctx, strategy)
    weights = 70.6e9 / 4  # FP8, TP 4 (embeddings and head split too)
    kv = kv_capacity_tokens(ctx, strategy, static) * per_token
    assert kv + weights == pytest.approx(0.85 * ctx.cluster.gpu.hbm_bytes, rel=0.01)
    assert kv_capacity_tokens(ctx, strategy, inside) < kv_capacity_tokens(ctx, strategy, static)


def test_a_runtime_without_a_memory_fraction_is_refused():
    from simcore.serving.runtime import ServingInputError

    with pytest.raises(ServingInputError, match="mem_fraction must be given"):
        get_runtime("vllm").with_overrides(mem_fraction=None)


def test_a_runs_memory_fraction_replaces_the_profiles_and_reaches_the_launch():
    """``serving.mem_fraction``: SGLang's own default leaves DeepSeek-V3 no room at DP-attention 16 on
    H100s (it reserves 4.5 x the CUDA-graph batch per rank); an explicit 0.8, as DeepEP launches pass,
    does, and the launch carries it."""
    from simcore.export.serving import serving_launch
    from simcore.serving.kvcache import kv_capacity_tokens
    from simcore.serving.runtime import ServingInputError

    ctx = CostContext(get_model("deepseek-v3"), Workload(precision="fp8"), Cluster.simple("h100-sxm", 16))
    strategy = runtime_strategy(tp=1, ep=16)
    default = ServingConfig(runtime="sglang")
    explicit = ServingConfig(runtime="sglang", mem_fraction=0.8)
    assert kv_capacity_tokens(ctx, strategy, default.runtime_profile()) == 0
    assert kv_capacity_tokens(ctx, strategy, explicit.runtime_profile()) > 100_000
    plan = ServingPlan.aggregated(strategy, 1, 256)
    assert "--mem-fraction-static 0.8 " in serving_launch(plan, ctx.model, "sglang",
                                                          runtime=explicit.runtime_profile()).to_text()
    with pytest.raises(ServingInputError, match="serving.mem_fraction"):
        ServingConfig(runtime="sglang", mem_fraction=1.5)
