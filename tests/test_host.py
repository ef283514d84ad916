"""The runtime around the kernels (simcore.cost.host): host time once per step, synchronous or overlapped,
CUDA-graph replay or eager launches; proxy and simulator agree on each."""

import dataclasses

import pytest

from simcore.cost.host import graph_kernel_s
from simcore.cost.lowering import StrategyArrays, lower
from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, simulate
from simcore.engine.program import build_programs
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload
from tests.conftest import make_ctx
from topologies import build_topology

OFF = EngineConfig(contention=False, overlap=False)


def _with(ctx, host_s=None, **workload):
    gpu = ctx.cluster.gpu if host_s is None else ctx.cluster.gpu.with_overrides(iteration_overhead_s=host_s)
    return dataclasses.replace(ctx, cluster=dataclasses.replace(ctx.cluster, gpu=gpu),
                               workload=dataclasses.replace(ctx.workload, **workload))


def _stages(ctx, s, phase):
    return [p.duration_s for p in build_programs(ctx, s, phase)]


def _kernels(ctx, s, phase="decode"):
    """Kernels one GPU of a single-stage plan launches per microbatch (tasks that cost something)."""
    blocks = lower(ctx, StrategyArrays.from_strategies([s]), phase)
    layer = sum(t.count for t in blocks["dense_layer"] if float(t.time_s[0]) > 0)
    return sum(t.count for t in blocks["first"] + blocks["last"] if float(t.time_s[0]) > 0) + ctx.model.num_layers * layer


@pytest.mark.parametrize("microbatches", [1, 4, 8])
def test_pp_decode_step_is_gpu_composition_plus_host_once(microbatches):
    """PP8: the step is max(mb x slowest stage, sum of stages) + host, whatever the microbatches."""
    ctx = _with(make_ctx("llama-3.1-70b", 8, "decode", input_len=1024), host_s=3e-3)
    s = megatron_strategy(tp=1, pp=8, batch=64, microbatches=microbatches)
    stage = _stages(ctx, s, "decode")
    gpu = max(microbatches * max(stage), sum(stage))
    r = evaluate(ctx, s)
    assert r.step_time_s == pytest.approx(gpu + 3e-3, rel=1e-9)
    assert r.by_category["host"] == pytest.approx(3e-3, rel=1e-9)
    assert evaluate(_with(ctx, host_s=0.0), s).step_time_s == pytest.approx(gpu, rel=1e-9)


def test_prefill_pays_host_once_per_pass():
    ctx = _with(make_ctx("llama-3.1-8b", 4, "prefill", input_len=512), host_s=2e-3)
    s = megatron_strategy(tp=1, pp=4, batch=8, microbatches=4)
    stage = _stages(ctx, s, "prefill")
    assert evaluate(ctx, s).step_time_s == pytest.approx(sum(stage) + 3 * max(stage) + 2e-3, rel=1e-9)


def test_overlapped_host_takes_the_longer_of_gpu_and_host():
    ctx = make_ctx("llama-3.1-8b", 2, "decode", input_len=512)
    s = megatron_strategy(tp=1, pp=2, batch=8, microbatches=2)
    gpu = evaluate(_with(ctx, host_s=0.0), s).step_time_s
    assert evaluate(_with(ctx, host_s=1e-3, host_overlap=True), s).step_time_s == pytest.approx(max(gpu, 1e-3))
    assert evaluate(_with(ctx, host_s=1.0, host_overlap=True), s).step_time_s == pytest.approx(1.0)
    assert evaluate(_with(ctx, host_s=1e-3), s).step_time_s == pytest.approx(gpu + 1e-3)


def test_static_batch_pays_host_per_prefill_and_per_output_token():
    ctx = make_ctx("llama-3.1-8b", 1, "static", input_len=256, output_len=64)
    s = megatron_strategy(tp=1, batch=4, microbatches=2)
    without = evaluate(_with(ctx, host_s=0.0), s)
    with_host = evaluate(_with(ctx, host_s=1e-3), s)
    assert with_host.step_time_s - without.step_time_s == pytest.approx((1 + 64) * 1e-3, rel=1e-9)
    assert with_host.tpot_s - without.tpot_s == pytest.approx(1e-3, rel=1e-9)


def test_lowering_has_no_host_task():
    ctx = make_ctx("llama-3.1-8b", 1, "decode")
    blocks = lower(ctx, StrategyArrays.from_strategies([megatron_strategy(tp=1, batch=1)]), "decode")
    assert all(t.kind != "host" for tasks in blocks.values() for t in tasks)


def test_cuda_graphs_drop_each_kernel_to_its_replay_cost():
    """Single GPU, batch 1: every task is a compute kernel, so graph replay saves exactly
    kernels x (kernel_overhead_s - graph_kernel_s)."""
    ctx = make_ctx("llama-3.1-8b", 1, "decode", input_len=128)
    s = megatron_strategy(tp=1, batch=1)
    saved = _kernels(ctx, s) * (ctx.cluster.gpu.kernel_overhead_s - graph_kernel_s())
    eager = evaluate(ctx, s).step_time_s
    assert evaluate(_with(ctx, cuda_graphs=True), s).step_time_s == pytest.approx(eager - saved, rel=1e-9)


def test_eager_launch_floor_binds_when_launches_outlast_the_kernels():
    ctx = make_ctx("llama-3.1-8b", 1, "decode", input_len=128)
    s = megatron_strategy(tp=1, batch=1)
    host = ctx.cluster.gpu.iteration_overhead_s
    gpu = evaluate(ctx, s).step_time_s - host
    kernels = _kernels(ctx, s)
    slow = _with(ctx, launch_s=1e-3)  # 1 ms per launch: the host bounds the stage
    assert evaluate(slow, s).step_time_s == pytest.approx(kernels * 1e-3 + host, rel=1e-9)
    assert evaluate(_with(ctx, launch_s=1e-7), s).step_time_s == pytest.approx(gpu + host, rel=1e-12)


@pytest.mark.parametrize("workload", [{}, {"host_overlap": True}, {"cuda_graphs": True}, {"launch_s": 2e-4}])
@pytest.mark.parametrize("phase", ["decode", "prefill", "static"])
def test_simulator_equals_proxy_for_every_runtime_mode(workload, phase):
    ctx = _with(make_ctx("llama-3.1-8b", 8, phase, input_len=512, output_len=32), host_s=5e-3, **workload)
    graph = build_topology("hgx-h100", num_nodes=1)
    for s in (megatron_strategy(tp=2, pp=4, batch=16, microbatches=4), megatron_strategy(tp=1, pp=8, batch=8,
                                                                                         microbatches=8)):
        sim = simulate(ctx, graph, s, OFF)
        assert sim.step_time_s == pytest.approx(evaluate(ctx, s).step_time_s, rel=1e-6), (s, workload)
        for split in sim.split:
            assert sum(split.values()) == pytest.approx(sim.step_time_s, rel=1e-6)


def test_workload_rejects_a_negative_launch_cost():
    with pytest.raises(ValueError, match="workload.launch_s"):
        Workload(launch_s=-1e-6)
