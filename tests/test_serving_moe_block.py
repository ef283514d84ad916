"""The serving runtimes' MoE block at decode: the grouped kernels' HBM bandwidth on the experts' weights
(``moe_memory_efficiency``) and the fixed time per MoE layer (``moe_layer_s``)."""

from __future__ import annotations

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext, expert_gemm_s
from simcore.hardware.kernels import gemm_bytes
from simcore.models import get_model
from simcore.serving import GroupBatch, ServingInputError, StepCost, get_runtime, runtime_strategy
from simcore.workload import Workload

DECODE = GroupBatch.of([], [1000] * 4, 4)
PREFILL = GroupBatch.of([(4096, 0)], [], 1)


def _cost(model: str, **runtime) -> StepCost:
    """SGLang's profile with the MoE block priced as dense GEMMs unless ``runtime`` says otherwise."""
    ctx = CostContext(get_model(model), Workload(precision="fp8"), Cluster.simple("h200", 8))
    rt = get_runtime("sglang").with_overrides(**({"moe_memory_efficiency": 1.0, "moe_layer_s": 0.0} | runtime))
    return StepCost(ctx, runtime_strategy(tp=8), rt)


def _step_s(cost: StepCost, batch: GroupBatch) -> float:
    return sum(cost.stage_times([batch])[0])


@pytest.mark.parametrize("field,bad", [("moe_memory_efficiency", 0.0), ("moe_memory_efficiency", 1.2),
                                       ("moe_layer_s", -1e-6)])
def test_a_bad_value_is_a_one_line_error_naming_the_field(field, bad):
    with pytest.raises(ServingInputError, match=field):
        get_runtime("vllm").with_overrides(**{field: bad})


def test_the_expert_kernel_reads_its_weights_at_most_at_its_bandwidth():
    """At decode sizes the weights set the time: a bandwidth of half the dense GEMM's doubles that part."""
    ctx = _cost("deepseek-v3").ctx
    gpu = ctx.cluster.gpu
    m, n, k, active = 1.0, 512.0, 7168.0, 32.0
    dense = float(expert_gemm_s(m, n, k, active, gpu, "fp8"))
    rate = gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency * 0.5
    slow = float(expert_gemm_s(m, n, k, active, gpu, "fp8", bytes_per_s=rate))
    assert slow == pytest.approx(float(gemm_bytes(m, n, k, "fp8", count=active)) / rate + gpu.kernel_overhead_s)
    assert slow > 1.8 * (dense - gpu.kernel_overhead_s)


def test_memory_efficiency_slows_a_decode_and_leaves_a_dense_model_alone():
    assert _step_s(_cost("deepseek-v3", moe_memory_efficiency=0.5), DECODE) > \
        1.2 * _step_s(_cost("deepseek-v3"), DECODE)
    assert _cost("deepseek-v3").runtime.expert_bytes_per_s(_cost("deepseek-v3").gpu) is None
    assert _step_s(_cost("llama-3.1-70b", moe_memory_efficiency=0.5), DECODE) == \
        _step_s(_cost("llama-3.1-70b"), DECODE)


@pytest.mark.parametrize("batch", [DECODE, PREFILL])
def test_the_fixed_time_counts_once_per_moe_layer_and_step(batch):
    model = get_model("deepseek-v3")
    added = _step_s(_cost("deepseek-v3", moe_layer_s=50e-6), batch) - _step_s(_cost("deepseek-v3"), batch)
    assert added == pytest.approx(model.num_moe_layers * 50e-6)
    assert _step_s(_cost("llama-3.1-70b", moe_layer_s=50e-6), batch) == _step_s(_cost("llama-3.1-70b"), batch)
