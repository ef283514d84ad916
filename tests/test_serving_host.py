"""Host time per step under attention data parallelism: each group's scheduler prepares its own sequences."""

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
from simcore.serving.requests import Request
from simcore.serving.worker import step_host_s
from simcore.workload import Workload


def test_a_steps_host_time_is_its_busiest_groups():
    rt = get_runtime("trtllm").with_overrides(step_host_s=1e-3, step_host_per_seq_s=100e-6)
    reqs = [Request(rid=i, arrival_s=0.0, input_len=10, output_len=10) for i in range(7)]
    picks = [[(r, 1) for r in reqs[:4]], [(r, 1) for r in reqs[4:]], []]
    assert step_host_s(rt, picks) == pytest.approx(1e-3 + 4 * 100e-6)
    assert step_host_s(rt, [[(r, 1) for r in reqs]]) == pytest.approx(1e-3 + 7 * 100e-6)


def test_a_host_bound_attention_dp_worker_pays_one_groups_host_per_step():
    """16 clients on 4 attention-DP groups with 1 ms of host per sequence, before each step (synchronous
    host): a step takes 4 ms more than without host time (4 sequences a group), not 16 ms more."""
    ctx = CostContext(get_model("qwen3-30b-a3b"), Workload(precision="bf16"), Cluster.simple("h200", 8))
    cfg = ServingConfig(concurrency=16, num_requests=64, runtime="vllm-sync", seed=2,
                        input_len=LengthDist("fixed", mean=200), output_len=LengthDist("fixed", mean=200))
    plan = ServingPlan.aggregated(runtime_strategy(tp=1, ep=4), 1, 64)
    tpot = []
    for per_seq in (0.0, 1e-3):
        rt = get_runtime("vllm-sync").with_overrides(step_host_s=0.0, step_host_per_seq_s=per_seq)
        result = simulate_serving(ctx, plan, cfg, runtime=rt)
        assert result.feasible
        tpot.append(result.metrics.tpot_s["mean"])
    assert tpot[1] - tpot[0] == pytest.approx(4e-3, rel=0.02)


def _deepseek_step(runtime, chunks, decodes, model="deepseek-v3"):
    from simcore.serving import GroupBatch, StepCost

    ctx = CostContext(get_model(model), Workload(precision="fp8"), Cluster.simple("h200", 8))
    cost = StepCost(ctx, runtime_strategy(tp=8), runtime)
    batch = GroupBatch.of(chunks, decodes, len(decodes) + bool(chunks), 1)
    return cost, sum(cost.gpu_times([batch], runtime))


def test_an_eager_moe_forward_is_host_bound_at_its_published_time():
    """SGLang PR #12160: DeepSeek-V3 at TP 8 prefilled one new token in 82.6 ms eager (23.1 ms in a CUDA
    graph). The eager floor (the lowering's launches plus eager_moe_layer_s per MoE layer) gives it back."""
    rt = get_runtime("sglang")
    cost, eager = _deepseek_step(rt, [(1, 6)], [])
    assert eager == pytest.approx(82.6e-3, rel=0.01)
    assert sum(cost.moe_layers) == 58
    # the same step with the constant off is the GPU's time, far below
    _, plain = _deepseek_step(rt.with_overrides(eager_moe_layer_s=0.0), [(1, 6)], [])
    assert plain < 0.3 * eager


def test_the_eager_moe_floor_spares_graphs_dense_models_and_vllm():
    rt = get_runtime("trtllm")
    on, off = rt, rt.with_overrides(eager_moe_layer_s=0.0)
    # a decode step replays a CUDA graph: no eager floor
    assert _deepseek_step(on, [], [1000] * 8)[1] == _deepseek_step(off, [], [1000] * 8)[1]
    # a dense model has no MoE layer to pay it
    assert _deepseek_step(on, [(1024, 0)], [], "llama-3.1-70b")[1] == \
        _deepseek_step(off, [(1024, 0)], [], "llama-3.1-70b")[1]
    # vLLM runs its large steps through torch.compile's code, not Python modules (runtime.py)
    assert get_runtime("vllm").eager_moe_layer_s == 0.0 and get_runtime("vllm-sync").eager_moe_layer_s == 0.0
    # and an MoE prompt step on TensorRT-LLM pays it: at least 58 x 1.3 ms
    assert _deepseek_step(on, [(1024, 0)], [])[1] >= 58 * on.eager_moe_layer_s
    with pytest.raises(ValueError, match="eager_moe_layer_s"):
        rt.with_overrides(eager_moe_layer_s=-1.0)
