"""Host time per step under attention data parallelism: each group's scheduler prepares its own sequences."""

import pytest

from simcore.cluster import Cluster
from simcore.lowering import CostContext
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
