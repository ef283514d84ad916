"""Serving simulation: the fast single-stage path equals the reference, hand-checkable steps, bad input."""

from __future__ import annotations

import math

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext, StrategyArrays, lower
from simcore.models import get_model
from simcore.serving import (
    GroupBatch,
    LengthDist,
    Pool,
    ServingConfig,
    ServingInputError,
    ServingPlan,
    StepCost,
    get_runtime,
    read_trace,
    simulate_serving,
)
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload


def _ctx(model="llama-3.1-8b", gpus=8, precision="fp8"):
    return CostContext(get_model(model), Workload(precision=precision), Cluster.simple("h200", gpus))


def _key(result):
    """What the fast path must reproduce: counts, latencies, and each pool's step statistics."""
    m = result.metrics
    pools = tuple(v for role in sorted(result.pool_stats) for v in result.pool_stats[role].values())
    return (result.steps, m.requests, m.ttft_s["mean"], m.tpot_s["mean"], m.itl_s["p99"], m.e2e_s["p90"]) + pools


@pytest.mark.parametrize("runtime", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("arrival", ["closed", "poisson"])
@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_fast_path_equals_reference(runtime, arrival, mode):
    """Folded decode runs equal the step-by-step reference; on a disaggregated plan's decode workers
    too, where each request's first token is released at its first step (Request.hold_first)."""
    ctx = _ctx()
    plan = ServingPlan.aggregated(megatron_strategy(tp=2), workers=2, max_num_seqs=32) if mode == "agg" else \
        ServingPlan.disaggregated(Pool(megatron_strategy(tp=1), 1, 16), Pool(megatron_strategy(tp=1), 2, 32))
    cfg = ServingConfig(arrival=arrival, concurrency=24, rate=40.0, num_requests=60, runtime=runtime,
                        input_len=LengthDist("uniform", mean=600, low=200, high=1200),
                        output_len=LengthDist("uniform", mean=100, low=20, high=200), seed=3)
    fast = simulate_serving(ctx, plan, cfg, fast=True)
    slow = simulate_serving(ctx, plan, cfg, fast=False)
    assert fast.feasible and slow.feasible
    assert _key(fast) == pytest.approx(_key(slow), rel=1e-9)


def test_step_cost_memo_equals_lowering():
    """A decode-only step's non-attention time is the lowering's decode tasks minus attention and host."""
    ctx = _ctx("llama-3.1-70b")
    s = megatron_strategy(tp=4, batch=16)
    cost = StepCost(ctx, s)
    contexts = [1000 + 7 * i for i in range(16)]
    times, _, tokens, _ = cost.stage_times([GroupBatch.of([], contexts, 16)])
    assert tokens == 16
    w = Workload(precision="fp8", input_len=int(sum(contexts) / 16))
    ref_ctx = CostContext(ctx.model, w, ctx.cluster)
    blocks = lower(ref_ctx, StrategyArrays.from_strategies([s]), "decode", sum(contexts) / 16)
    layers = ctx.model.num_layers
    ref = sum(float(t.time_s[0]) * t.count for t in blocks["first"] + blocks["last"] if t.kind != "host")
    ref += layers * sum(float(t.time_s[0]) * t.count for t in blocks["dense_layer"])
    # the decode lowering prices attention at the mean context: the same bytes and FLOPs in one kernel
    assert sum(times) == pytest.approx(ref, rel=1e-9)
    # memoized: the same token count again runs no lowering, and its stage times are a fresh cost's
    before = cost.lowerings
    later = [GroupBatch.of([], [c + 1 for c in contexts], 16)]
    assert cost.stage_times(later) == StepCost(ctx, s).stage_times(later)
    assert cost.lowerings == before


def test_single_request_latency_is_hand_computable():
    """One request alone: TTFT = host + prefill step; each further token one decode step + host."""
    ctx = _ctx()
    plan = ServingPlan.aggregated(megatron_strategy(tp=1), 1, 8)
    rt = get_runtime("vllm-sync")  # host not overlapped: it adds to every step
    cfg = ServingConfig(concurrency=1, num_requests=1, runtime="vllm-sync", input_len=LengthDist(mean=512),
                        output_len=LengthDist(mean=4))
    r = simulate_serving(ctx, plan, cfg)
    cost = StepCost(ctx, plan.pool.strategy)
    prefill = sum(cost.gpu_times([GroupBatch.of([(512, 0)], [], 1)], rt))
    decodes = [sum(cost.gpu_times([GroupBatch.of([], [513 + i], 1)], rt)) for i in range(3)]
    assert r.metrics.ttft_s["mean"] == pytest.approx(rt.request_path_s(512) + rt.host_s(1) + prefill, rel=1e-9)
    assert r.metrics.tpot_s["mean"] == pytest.approx(sum(decodes) / 3 + rt.host_s(1), rel=1e-9)


@pytest.mark.parametrize("arrival", ["closed", "poisson"])
def test_request_path_adds_to_ttft_only(arrival):
    """The runtime's request path delays each request's arrival at the scheduler: with one client (or
    arrivals far apart) the server is idle meanwhile, so every TTFT grows by exactly that time."""
    ctx = _ctx()
    plan = ServingPlan.aggregated(megatron_strategy(tp=1), 1, 8)
    cfg = ServingConfig(arrival=arrival, concurrency=1, rate=0.05, num_requests=4, runtime="sglang",
                        input_len=LengthDist("uniform", mean=500, low=300, high=700), output_len=LengthDist(mean=6))
    rt = get_runtime("sglang")
    runs = [simulate_serving(ctx, plan, cfg, runtime=rt.with_overrides(request_s=r)) for r in (0.0, 0.07)]
    assert runs[1].metrics.ttft_s["mean"] == pytest.approx(runs[0].metrics.ttft_s["mean"] + 0.07, rel=1e-9)
    assert runs[1].metrics.tpot_s["mean"] == pytest.approx(runs[0].metrics.tpot_s["mean"], rel=1e-9)
    with pytest.raises(ServingInputError, match="request"):
        rt.with_overrides(request_s=-1e-3)


def test_graph_replay_saves_each_kernels_launch_cost():
    ctx = _ctx()
    cost = StepCost(ctx, megatron_strategy(tp=2))
    batch = [GroupBatch.of([], [800] * 8, 8)]
    times, _, _, compute = cost.stage_times(batch)
    rt = get_runtime("vllm")
    graph = cost.gpu_times(batch, rt)
    saved = compute[0] * (ctx.cluster.gpu.kernel_overhead_s - rt.graph_kernel_s)
    assert compute[0] >= 6 * ctx.model.num_layers  # qkv, attention, out_proj, 2 norms, 2 FFN GEMMs a layer
    assert graph[0] == pytest.approx(times[0] - saved, rel=1e-12)
    eager = cost.gpu_times(batch, rt.with_overrides(graph_max_tokens=0))
    assert eager[0] >= times[0]


def test_more_load_more_latency_and_throughput():
    ctx = _ctx()
    plan = ServingPlan.aggregated(megatron_strategy(tp=1), 1, 256)
    lo, hi = (simulate_serving(ctx, plan, ServingConfig(concurrency=c, num_requests=4 * c,
                                                          output_len=LengthDist(mean=128))) for c in (4, 64))
    assert hi.metrics.tpot_s["mean"] > lo.metrics.tpot_s["mean"]
    assert hi.metrics.output_tokens_per_s_per_gpu > 3 * lo.metrics.output_tokens_per_s_per_gpu


def test_kv_exhaustion_preempts_and_still_finishes():
    ctx = _ctx("llama-3.1-70b", precision="bf16")
    rt = get_runtime("vllm").with_overrides(mem_fraction=0.72)  # 70B bf16 on 2 GPUs: a small KV cache
    plan = ServingPlan.aggregated(megatron_strategy(tp=2), 1, 256)
    cfg = ServingConfig(concurrency=128, num_requests=128, input_len=LengthDist(mean=2048),
                        output_len=LengthDist(mean=512))
    r = simulate_serving(ctx, plan, cfg, runtime=rt)
    assert r.feasible and r.metrics.requests == 128
    assert r.metrics.preemptions > 0


def test_disaggregated_runs_and_moves_kv():
    ctx = _ctx("llama-3.1-70b", gpus=16)
    plan = ServingPlan.disaggregated(Pool(megatron_strategy(tp=4), 1, 64), Pool(megatron_strategy(tp=4), 2, 128))
    cfg = ServingConfig(concurrency=32, num_requests=64, input_len=LengthDist(mean=2048),
                        output_len=LengthDist(mean=64), runtime="sglang")
    from topologies import build_topology

    graph = build_topology("h200-ib-rail", num_nodes=2)
    r = simulate_serving(ctx, plan, cfg, graph=graph)
    assert r.feasible and r.metrics.requests == 64
    assert plan.gpus == 12
    assert not math.isnan(r.metrics.tpot_s["mean"])


def test_disaggregated_first_token_comes_with_the_decode_workers_first_step():
    """The runtimes stream a disaggregated request from its decode worker (simulate.py's module doc): its
    TTFT is the prefill, the KV transfer and the decode worker's first step on it, and its first two
    tokens reach the client together. One request alone on idle workers (SGLang: overlapped host, so no
    host time before a first step), against the same prefill on an aggregated worker of that layout."""
    ctx = _ctx("llama-3.1-8b", gpus=2)
    s = megatron_strategy(tp=1)
    cfg = ServingConfig(concurrency=1, num_requests=1, input_len=LengthDist(mean=1024), output_len=LengthDist(mean=8),
                        runtime="sglang")
    disagg = simulate_serving(ctx, ServingPlan.disaggregated(Pool(s, 1, 8), Pool(s, 1, 8)), cfg)
    agg = simulate_serving(ctx, ServingPlan.aggregated(s, 1, 8), cfg)
    assert disagg.feasible and agg.feasible
    rt = get_runtime("sglang")
    transfer = 1024 * ctx.model.kv_cache_bytes_per_token(ctx.workload.kv_bytes) / ctx.cluster.gpu.nic_bandwidth_bytes_per_s
    first_decode = sum(StepCost(ctx, s, rt).gpu_times([GroupBatch.of([], [1025], 1)], rt))
    assert transfer > 0 and first_decode > 0
    ttft = disagg.metrics.ttft_s["mean"]
    assert ttft == pytest.approx(agg.metrics.ttft_s["mean"] + transfer + first_decode, rel=1e-9)
    # tokens 1 and 2 arrive together: after the first token, the aggregated worker's 7 decode steps
    # less the first of them (the same step, in the disaggregated TTFT)
    span = {name: r.metrics.e2e_s["mean"] - r.metrics.ttft_s["mean"] for name, r in (("d", disagg), ("a", agg))}
    assert span["d"] == pytest.approx(span["a"] - first_decode, rel=1e-9)


def test_hand_offs_in_flight_count_toward_the_decode_workers_load():
    """Two prompts prefilled in one step hand off at the same instant; the second is routed knowing
    the first is on its way (Worker.load), so each decode worker (one sequence each) takes one, and
    neither waits for the other's whole decode before its first token."""
    ctx = _ctx("llama-3.1-8b", gpus=3)
    s = megatron_strategy(tp=1)
    cfg = ServingConfig(concurrency=2, num_requests=2, input_len=LengthDist(mean=512), output_len=LengthDist(mean=64),
                        runtime="sglang")
    r = simulate_serving(ctx, ServingPlan.disaggregated(Pool(s, 1, 2), Pool(s, 2, 1)), cfg)
    assert r.feasible
    assert r.metrics.ttft_s["p99"] == pytest.approx(r.metrics.ttft_s["p50"], rel=1e-9)


@pytest.mark.parametrize("kwargs, field", [
    ({"concurrency": 0}, "serving.concurrency"),
    ({"arrival": "burst"}, "serving.arrival"),
    ({"runtime": "tgi"}, "serving.runtime"),
    ({"arrival": "poisson", "rate": 0.0}, "serving.rate"),
])
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ServingInputError, match=field):
        ServingConfig(**kwargs)


def test_bad_trace_names_the_column(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_len\n0,10\n")
    with pytest.raises(ServingInputError, match="output_len"):
        read_trace(p)
    p.write_text("arrival_s,input_len,output_len\n0,-5,10\n")
    with pytest.raises(ServingInputError, match="input_len"):
        read_trace(p)


def test_small_tp_all_reduce_takes_the_runtimes_kernel():
    """Decode all-reduces of a few KiB run on the runtime's one-/two-shot kernel, not NCCL's."""
    from simcore.collectives.constants import DEFAULT

    ctx = _ctx("llama-3.1-70b")
    s = megatron_strategy(tp=4)
    rt = get_runtime("vllm")
    batch = [GroupBatch.of([], [1000] * 4, 4)]
    assert sum(StepCost(ctx, s, rt).stage_times(batch)[0]) < sum(StepCost(ctx, s).stage_times(batch)[0])
    size = 4 * 8192 * 2.0  # 4 tokens x hidden 8192 x bf16: one-shot, (n - 1) buffers read after one barrier
    bw = ctx.cluster.gpu.nvlink_bandwidth_bytes_per_s * DEFAULT.nvlink_efficiency
    assert StepCost(ctx, s, rt).custom_all_reduce_s(size) == pytest.approx(rt.custom_ar_s + 3 * size / bw)


def test_tensorrt_llm_memory_fraction_is_of_the_memory_the_weights_leave():
    """TensorRT-LLM's free_gpu_memory_fraction takes a share of what is free after the model loads;
    vLLM's gpu_memory_utilization a share of all HBM: the same 0.45 gives TensorRT-LLM far more KV."""
    from simcore.serving.kvcache import kv_capacity_tokens
    from simcore.strategy.sharding import megatron_strategy

    ctx = CostContext(get_model("llama-3.1-70b"), Workload(precision="fp8"), Cluster.simple("h200", 8))
    s = megatron_strategy(tp=1)
    free = get_runtime("trtllm").with_overrides(mem_fraction=0.45)
    total = free.with_overrides(mem_fraction_of_free=False)
    whole = free.with_overrides(mem_fraction=1.0)
    # 70 GB of weights > 0.45 x 150.75 GB
    assert kv_capacity_tokens(ctx, s, total) == 0 < kv_capacity_tokens(ctx, s, free)
    assert kv_capacity_tokens(ctx, s, free) == pytest.approx(kv_capacity_tokens(ctx, s, whole) * 0.45, abs=1)


@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_weights_that_fill_the_hbm_name_the_pool_and_its_layout(mode):
    """Llama-3.1-70B in BF16 (141 GB) on one 80 GB H100: no room for a KV cache, said in one line."""
    ctx = CostContext(get_model("llama-3.1-70b"), Workload(precision="bf16"), Cluster.simple("h100-sxm", 8))
    fits, full = megatron_strategy(tp=4), megatron_strategy(tp=1)
    plan = (ServingPlan.aggregated(full, workers=1) if mode == "agg"
            else ServingPlan.disaggregated(Pool(fits, 1, 64), Pool(full, 1, 64)))
    result = simulate_serving(ctx, plan, ServingConfig(concurrency=4, num_requests=8))
    assert not result.feasible and "\n" not in result.reason
    pool = "the pool's" if mode == "agg" else "the decode pool's"
    assert result.reason == f"hbm_capacity: {pool} weights leave no room for a KV cache (tp1 ep1 pp1 on h100-sxm)"


@pytest.mark.parametrize("model", ["qwen3-235b-a22b", "gpt-oss-120b", "deepseek-v3"])
def test_runtime_layout_all_reduces_an_moe_layer_twice(model):
    """The serving runtimes' layout gives a tensor-parallel MoE layer two all-reduces (after the attention
    output, after the experts) and nothing else on the TP group; Megatron's token-split router a
    reduce-scatter and all-gathers back. A dense layer communicates the same under both."""
    from simcore.cost.lowering import _Lowerer
    from simcore.serving import runtime_strategy
    from simcore.strategy import layout as L

    ctx = _ctx(model)

    def collectives(strategy, moe=True):
        low = _Lowerer(ctx, StrategyArrays.from_strategies([strategy]), "decode", 1000)
        return sorted(L.COLLECTIVE_NAMES[int(t.extra["collective"])] for t in low.layer(moe=moe)
                      if t.is_comm and t.group == "tp" and int(t.extra.get("collective", 0)))

    assert collectives(runtime_strategy(tp=4)) == ["all_reduce", "all_reduce"]
    megatron = collectives(megatron_strategy(tp=4))  # a reduce-scatter, all-gathers back (more with shared experts)
    assert megatron.count("reduce_scatter") == 1 and megatron.count("all_gather") >= 2
    assert collectives(runtime_strategy(tp=1)) == []
    dense = _ctx("llama-3.1-70b")
    low = [_Lowerer(dense, StrategyArrays.from_strategies([s]), "decode", 1000).layer(moe=False)
           for s in (runtime_strategy(tp=4), megatron_strategy(tp=4))]
    assert [float(t.time_s) for t in low[0]] == [float(t.time_s) for t in low[1]]


@pytest.mark.parametrize("runtime", ["vllm", "trtllm"])
def test_fast_path_equals_reference_for_an_moe_model_with_its_moe_block(runtime):
    """The memoized single-stage path with the runtimes' layout and a priced MoE block (grouped kernels'
    bandwidth, fixed time per MoE layer) equals the reference step by step."""
    from simcore.serving import runtime_strategy

    ctx = _ctx("qwen3-235b-a22b")
    rt = get_runtime(runtime).with_overrides(moe_memory_efficiency=0.5, moe_layer_s=60e-6)
    assert rt.moe_layer_s and rt.expert_bytes_per_s(ctx.cluster.gpu) is not None
    plan = ServingPlan.aggregated(runtime_strategy(tp=4), workers=2, max_num_seqs=32)
    cfg = ServingConfig(concurrency=16, num_requests=40, runtime=runtime,
                        input_len=LengthDist("uniform", mean=600, low=200, high=1200),
                        output_len=LengthDist("uniform", mean=60, low=20, high=100), seed=5)
    fast = simulate_serving(ctx, plan, cfg, runtime=rt, fast=True)
    slow = simulate_serving(ctx, plan, cfg, runtime=rt, fast=False)
    assert fast.feasible and slow.feasible
    assert _key(fast) == pytest.approx(_key(slow), rel=1e-9)


def test_a_full_width_qk_norm_all_reduces_its_variances_once_per_layer():
    """MiniMax-M2 normalises q and k over all heads: with heads split over TP ranks, one extra all-reduce
    of 8 bytes per token (two FP32 sums of squares); none at TP 1, none for a per-head norm (Qwen3)."""
    from simcore.cost.lowering import _Lowerer
    from simcore.serving import runtime_strategy

    def qk_norm_tasks(model, tp):
        low = _Lowerer(_ctx(model), StrategyArrays.from_strategies([runtime_strategy(tp=tp)]), "decode", 1000)
        return [t for t in low.layer(moe=True) if t.name == "qk_norm" and int(t.extra.get("collective", 0))]

    [task] = qk_norm_tasks("minimax-m2", 4)
    assert task.group == "tp" and float(task.size_bytes) == pytest.approx(8.0 * float(
        _Lowerer(_ctx("minimax-m2"), StrategyArrays.from_strategies([runtime_strategy(tp=4)]), "decode",
                 1000).tokens)) and float(task.time_s) > 0
    assert qk_norm_tasks("minimax-m2", 1) == [] and qk_norm_tasks("qwen3-235b-a22b", 4) == []


def test_a_step_waits_for_its_busiest_expert_rank_under_skewed_routing():
    """With ``ctx.routing`` set, an expert-parallel step prices each MoE layer at the busiest rank's
    expected load (the proxy's expectation); uniform routing over evenly split experts changes nothing."""
    from simcore.moe import RoutingConfig, expected_max_loads
    from simcore.serving import runtime_strategy

    base = _ctx("deepseek-v3")
    s = runtime_strategy(tp=1, ep=8)
    groups = [GroupBatch.of([], [2000 + 50 * g + i for i in range(16)], 16) for g in range(8)]

    def step(routing):
        ctx = CostContext(base.model, base.workload, base.cluster, routing=routing)
        cost = StepCost(ctx, s)
        return sum(cost.stage_times(groups)[0]), cost

    plain, _ = step(None)
    same, uniform = step(RoutingConfig())
    skewed, cost = step(RoutingConfig(distribution="zipf", zipf_skew=1.0))
    m = base.model
    assert uniform.expert_load(16) == 1.0 and same == plain
    load = cost.expert_load(16)
    assert load == pytest.approx(float(expected_max_loads(cost.ctx.routing, m.num_experts, 8, 16 * 8 * m.top_k)))
    assert load > 1.2 and skewed > plain
    assert StepCost(cost.ctx, runtime_strategy(tp=8)).expert_load(16) == 1.0  # one expert rank: nothing to skew


def test_a_deepep_runtime_prices_its_all_to_alls_with_deepep_and_launches_with_it():
    """Profile sglang-deepep (moe_a2a_backend deepep): its steps price dispatch and combine with DeepEP's
    kernels as a context routing with a2a=deepep would; its SGLang launch carries --moe-a2a-backend deepep."""
    from simcore.export.serving import serving_launch
    from simcore.moe import RoutingConfig
    from simcore.serving import ServingPlan, get_runtime, runtime_strategy

    base = _ctx("deepseek-v3")
    s = runtime_strategy(tp=1, ep=8)
    groups = [GroupBatch.of([(512, 0)], [3000] * 8, 9) for _ in range(8)]
    deepep = get_runtime("sglang-deepep")
    cost = StepCost(base, s, runtime=deepep)
    assert cost.ctx.routing.a2a == "deepep" and base.routing is None
    routed = CostContext(base.model, base.workload, base.cluster, routing=RoutingConfig(a2a="deepep"))
    assert cost.stage_times(groups)[0] == StepCost(routed, s, runtime=deepep).stage_times(groups)[0]
    nccl = StepCost(base, s, runtime=deepep.with_overrides(moe_a2a_backend="none"))
    assert nccl.ctx.routing is None and nccl.stage_times(groups)[0] != cost.stage_times(groups)[0]
    plan = ServingPlan.aggregated(s, 1, 64)
    assert "--moe-a2a-backend deepep" in serving_launch(plan, base.model, "sglang", runtime=deepep).to_text()
    assert "--moe-a2a-backend" not in serving_launch(plan, base.model, "sglang").to_text()
    tbo = deepep.with_overrides(two_batch_overlap=True)
    assert "--enable-two-batch-overlap" in serving_launch(plan, base.model, "sglang", runtime=tbo).to_text()
    assert "--enable-two-batch-overlap" not in serving_launch(plan, base.model, "sglang", runtime=deepep).to_text()
    # its static memory fraction is the launch's 0.8, and the launch says so; plain SGLang keeps its default
    assert "--mem-fraction-static 0.8 " in serving_launch(plan, base.model, "sglang", runtime=deepep).to_text()
    assert "--mem-fraction-static" not in serving_launch(plan, base.model, "sglang").to_text()
    with pytest.raises(ServingInputError, match="moe_a2a_backend"):
        deepep.with_overrides(moe_a2a_backend="mooncake")


def test_the_step_memo_stays_exact_under_skewed_routing():
    """The skewed load depends only on the step's tokens, the memo's key: a memoized step equals the same
    step priced by a fresh StepCost (no memo), and an eager-step cost differs from the uniform one."""
    from simcore.moe import RoutingConfig
    from simcore.serving import runtime_strategy

    base = _ctx("deepseek-v3")
    ctx = CostContext(base.model, base.workload, base.cluster, routing=RoutingConfig(distribution="zipf"))
    s = runtime_strategy(tp=1, ep=8)
    first = [GroupBatch.of([(256, 0)], [1500 + g] * 32, 33) for g in range(8)]
    second = [GroupBatch.of([(256, 100)], [2500 + g] * 32, 33) for g in range(8)]  # same tokens and samples
    cost = StepCost(ctx, s)
    cost.stage_times(first)
    before = cost.lowerings
    memoized = cost.stage_times(second)
    assert cost.lowerings == before  # taken from the memo
    assert memoized == StepCost(ctx, s).stage_times(second)
    assert memoized != StepCost(base, s).stage_times(second)


def test_inter_token_latencies_are_every_gap_of_every_request():
    """The vectorised gaps equal the pairwise reference (exactly), and a request of one token has none."""
    import numpy as np

    from simcore.serving.metrics import summarize
    from simcore.serving.requests import Request

    rng = np.random.default_rng(3)
    reqs = []
    for rid in range(20):
        times = list(np.cumsum(rng.exponential(0.01, int(rng.integers(1, 40)))) + rid)
        req = Request(rid, float(rid), 10, len(times))
        req.first_token_s, req.finish_s, req.token_times, req.generated = times[0], times[-1], times, len(times)
        reqs.append(req)
    gaps = [b - a for r in reqs for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    itl = summarize(reqs, 1, None, None).itl_s
    assert itl["mean"] == float(np.asarray(gaps).mean()) and itl["p99"] == float(np.percentile(gaps, 99))
    one = Request(0, 0.0, 10, 1)
    one.first_token_s = one.finish_s = 1.0
    one.token_times, one.generated = [1.0], 1
    assert math.isnan(summarize([one], 1, None, None).itl_s["mean"])
