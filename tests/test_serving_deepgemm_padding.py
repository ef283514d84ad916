"""vLLM's DeepGEMM MoE path (``RuntimeProfile.moe_padded_rows``): every local expert's 128-row block computed
whatever the routing, and the vLLM versions and layouts the study gives it to."""

from __future__ import annotations

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.hardware.kernels import gemm_time_s
from simcore.models import get_model
from simcore.serving import GroupBatch, ServingInputError, StepCost, get_runtime
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload
from validation.studies.serving.mapping import map_row, version_fields

MODEL = "qwen3-235b-a22b"  # 128 experts, top 8, hidden 4096, expert FFN 1536, 94 MoE layers


def _cost(padded_rows: int, precision: str = "fp8", tp: int = 2) -> StepCost:
    ctx = CostContext(get_model(MODEL), Workload(precision=precision), Cluster.simple("h200", 8))
    runtime = get_runtime("vllm-sync").with_overrides(moe_padded_rows=padded_rows)
    return StepCost(ctx, megatron_strategy(tp=tp), runtime)


def _decode_s(cost: StepCost, seqs: int) -> float:
    return sum(cost.stage_times([GroupBatch.of([], [1000] * seqs, seqs)])[0])


def _moe_layer_s(cost: StepCost, tokens: int) -> float:
    return cost._blocks(tokens, tokens)["moe_layer"][0]


def test_padded_rows_price_every_experts_block_at_the_fp8_gemm_rate():
    """Hand-computable: at tp 2 each GPU holds all 128 experts, 768 of each one's 1536 FFN columns; 4
    decoding tokens route 32 copies; the two grouped GEMMs then cover 32 + 128 x 128 rows, gate/up
    4096 -> 2 x 768 and down 768 -> 4096, each a dense FP8 GEMM of that many rows (slower than the
    active experts' weight reads here), and the MoE layer grows by exactly that."""
    rows = 4 * 8 + 128 * 128
    padded, plain = _expert_s(_cost(128), 4), _expert_s(_cost(0), 4)
    gpu = _cost(128).gpu
    assert padded == [gemm_time_s(rows, 2 * 768, 4096, gpu, "fp8"), gemm_time_s(rows, 4096, 768, gpu, "fp8")]
    assert all(p > q for p, q in zip(padded, plain, strict=True))
    assert _moe_layer_s(_cost(128), 4) - _moe_layer_s(_cost(0), 4) == pytest.approx(sum(padded) - sum(plain))


def _expert_s(cost: StepCost, tokens: int) -> list[float]:
    """The two expert GEMM tasks of one MoE layer of a ``tokens``-token step, as ``cost`` lowers them."""
    from simcore.serving.step_cost import _NoAttention

    low = _NoAttention(cost.ctx, cost._arrays, "prefill", cost.w.input_len)
    low.tokens, low.seqs = float(tokens), float(tokens)
    low.expert_flops_per_s = cost.runtime.expert_flops_per_s(low.gpu, cost.w.precision)
    low.expert_bytes_per_s = cost.runtime.expert_bytes_per_s(low.gpu)
    low.expert_padded_rows = cost.runtime.moe_padded_rows
    return [float(t.time_s) for t in low.layer(moe=True) if t.name in ("expert_ffn1", "expert_ffn2")]


def test_the_padding_weighs_most_on_small_batches_and_halves_with_twice_the_expert_gpus():
    """The padded GEMM does not depend on the routed tokens, so it adds most to a small decode step,
    where the active experts' weight reads are few (4 sequences wake ~29 of 128 experts, 32 wake ~110),
    and it halves with twice the tensor parallelism (half of every expert per GPU): the shape of vLLM
    0.12's measured TPOT between moe_tp 2 and 4 (validation/reports/serving/history.md)."""
    def extra(seqs: int, tp: int = 2) -> float:
        return _decode_s(_cost(128, tp=tp), seqs) - _decode_s(_cost(0, tp=tp), seqs)

    assert extra(4) > 0 and extra(32) < extra(4) / 2  # at 32 the weight reads already take longer
    assert extra(4, tp=4) == pytest.approx(extra(4) / 2, rel=0.25)


def test_zero_rows_and_bf16_experts_are_priced_as_before():
    """The default (0) changes nothing, and the field is DeepGEMM's FP8 layout: BF16 experts ignore it."""
    assert _decode_s(_cost(0), 4) == _decode_s(
        StepCost(_cost(0).ctx, megatron_strategy(tp=2), get_runtime("vllm-sync")), 4)
    assert _decode_s(_cost(128, "bf16"), 4) == _decode_s(_cost(0, "bf16"), 4)


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_bad_padded_rows_is_a_one_line_error(bad):
    with pytest.raises(ServingInputError, match="moe_padded_rows"):
        get_runtime("vllm").with_overrides(moe_padded_rows=bad)


def _row(version: str, model: str = "Qwen/Qwen3-235B-A22B-FP8", precision: str = "fp8", tp: int = 2,
         moe_tp: int = 2, moe_ep: int = 1) -> dict:
    return {"backend": "vllm", "backend_version": version, "model_path": model, "system": "h200_sxm",
            "precision": precision, "mode": "agg", "isl": "1000", "osl": "100", "tp_size": str(tp),
            "pp_size": "1", "attention_dp_size": "", "moe_tp_size": str(moe_tp), "moe_ep_size": str(moe_ep),
            "batch_size": "", "silicon_ttft_ms": "100", "silicon_tpot_ms": "20",
            "silicon_data_source": "x; silicon_concurrency=4"}


@pytest.mark.parametrize(("row", "padded"), [
    (_row("0.12.0"), 128),                       # the fit rows' vLLM: DeepGEMM MoE at moe_tp 2
    (_row("0.14.1", tp=4, moe_tp=4), 128),
    (_row("0.13.0", tp=2, moe_tp=1, moe_ep=2), 128),  # expert parallel: vLLM's MoE TP degree is 1
    (_row("0.12.0", tp=8, moe_tp=8), 0),         # off by default at MoE TP 8 (PR #29346)
    (_row("0.11.0"), 0),                         # before E8M0 made DeepGEMM take every batch
    (_row("0.16.0", tp=4, moe_tp=4), 0),         # the test rows' vLLM
    (_row(""), 0),                               # unversioned: not known to take the path
    (_row("0.12.0", model="meta-llama/Llama-3.1-70B", moe_tp=1), 0),  # dense
])
def test_the_study_gives_the_padding_to_the_versions_and_layouts_that_take_that_path(row, padded):
    case = map_row(row)
    assert not case.skip, case.skip
    assert case.launch.get("moe_padded_rows", 0) == padded
    assert version_fields(dict(row, backend="sglang"), True, "fp8") == {}
