"""A 4-bit routed expert's bytes include its block scales, in its checkpoint's format (the serving study)."""

from pathlib import Path

import pytest

from simcore.models.quantization import (
    CHECKPOINT_FORMAT,
    FORMAT_BYTES,
    expert_weight_bytes,
    marlin_padding,
)
from simcore.serving import get_runtime, runtime_strategy
from simcore.serving.deployment.moe_kernels import vllm_mxfp4_padding
from simcore.serving.step_cost import GroupBatch, StepCost
from validation.studies.serving.mapping import map_row

_ROW = {"source_url": "x", "id": "row", "backend": "vllm", "backend_version": "0.16.0", "system": "h200_sxm",
        "mode": "agg", "isl": "1024", "osl": "1024", "batch_size": "4", "pp_size": "1", "tp_size": "8",
        "attention_dp_size": "1", "moe_tp_size": "8", "moe_ep_size": "1", "silicon_ttft_ms": "100",
        "silicon_tpot_ms": "10", "silicon_data_source": "x; silicon_concurrency=4"}


def _row(**kw) -> dict:
    return {**_ROW, **{k: str(v) for k, v in kw.items()}}


def test_format_bytes_are_four_bits_plus_one_scale_per_block():
    assert FORMAT_BYTES["mxfp4"] * 8 == pytest.approx(4.25)  # the gpt-oss model card's 4.25 bits a parameter
    assert FORMAT_BYTES["nvfp4"] == pytest.approx((16 * 0.5 + 1) / 16)  # 16 FP4 values + an FP8 scale
    assert FORMAT_BYTES["int4_g32"] == pytest.approx((32 * 0.5 + 2) / 32)  # 32 INT4 values + a BF16 scale
    assert FORMAT_BYTES["int4_g128"] == pytest.approx((128 * 0.5 + 2) / 128)


def test_the_checkpoint_names_the_format_not_the_rows_label():
    # aiconfigurator labels gpt-oss nvfp4; the checkpoint is MXFP4
    assert expert_weight_bytes("openai/gpt-oss-120b", "nvfp4") == FORMAT_BYTES["mxfp4"]
    assert expert_weight_bytes("moonshotai/Kimi-K2.5", "int4_wo") == FORMAT_BYTES["int4_g32"]
    # an unknown checkpoint takes its label's format; an INT4 one the common group of 128
    assert expert_weight_bytes("someone/other-moe", "nvfp4") == FORMAT_BYTES["nvfp4"]
    assert expert_weight_bytes("someone/other-moe", "mxfp4") == FORMAT_BYTES["mxfp4"]
    assert expert_weight_bytes("someone/other-moe", "int4_wo") == FORMAT_BYTES["int4_g128"]
    assert set(CHECKPOINT_FORMAT.values()) <= set(FORMAT_BYTES)


@pytest.mark.parametrize("model_path, precision, label, fmt, padding", [
    # InferenceX's gpt-oss vLLM launch runs Marlin: TP 8 holds 360 -> 384 x 2880 -> 3072 per expert matrix
    ("openai/gpt-oss-120b", "fp4", "nvfp4", "mxfp4", 384 * 3072 / (360 * 2880)),
    ("moonshotai/Kimi-K2.5", "int4", "int4_wo", "int4_g32", 1.0),
])
def test_study_rows_carry_their_checkpoints_expert_bytes(model_path, precision, label, fmt, padding):
    case = map_row(_row(model_path=model_path, precision=precision, gemm_quant_mode=label, moe_quant_mode=label))
    assert not case.skip, case.skip
    assert case.ctx.workload.expert_weight_bytes == pytest.approx(FORMAT_BYTES[fmt] * padding)
    fp8 = map_row(_row(model_path="MiniMaxAI/MiniMax-M2.5", precision="fp8", gemm_quant_mode="fp8",
                       moe_quant_mode="fp8"))
    assert fp8.ctx.workload.expert_weight_bytes is None  # FP8 block scales: 4 bytes per 16,384 weights


def _expert_gemms_s(ctx, tokens: int) -> float:
    """GPU seconds of one MoE layer's two grouped expert GEMMs at ``tokens`` decoding tokens, TP 8,
    under profile vllm's MoE kernel rates."""
    from simcore.cost.lowering import StrategyArrays
    from simcore.serving.step_cost import _NoAttention

    rt = get_runtime("vllm")
    arrays = StrategyArrays.from_strategies([runtime_strategy(tp=8).replace(dp=1, batch=1, microbatches=1)])
    low = _NoAttention(ctx, arrays, "prefill", ctx.workload.input_len)
    low.tokens = low.seqs = float(tokens)
    low.expert_flops_per_s = rt.expert_flops_per_s(low.gpu, ctx.workload.precision)
    low.expert_bytes_per_s = rt.expert_bytes_per_s(low.gpu)
    return sum(float(t.time_s) * t.count for t in low.layer(moe=True) if t.name.startswith("expert_ffn"))


def test_a_memory_bound_decode_step_reads_the_scales_too():
    """Kimi-K2.5 at TP 8: the scales add 0.0625 bytes a weight, 12.5% of the bare 4 bits. Where the
    weights' bytes bound the expert GEMMs (64 decoding tokens: ~60 of 384 experts active) their time
    grows by nearly that (the activations' bytes are unchanged); at fewer tokens the GEMMs' fixed
    costs weigh more, but never by more than 12.5%; and the step grows with them."""
    import dataclasses

    case = map_row(_row(model_path="moonshotai/Kimi-K2.5", precision="int4", gemm_quant_mode="int4_wo",
                        moe_quant_mode="int4_wo"))
    scaled = dataclasses.replace(case.ctx, routing=None)
    bare = dataclasses.replace(scaled, workload=dataclasses.replace(scaled.workload, expert_weight_bytes=0.5))
    ratios = [_expert_gemms_s(scaled, n) / _expert_gemms_s(bare, n) for n in (1, 4, 16, 64)]
    assert all(1.0 < r <= 1.125 for r in ratios), ratios
    assert ratios[-1] > 1.10, ratios
    step = [GroupBatch([], 4, 4 * 1500.0, 4)]
    strategy, rt = runtime_strategy(tp=8), get_runtime("vllm")
    assert sum(StepCost(scaled, strategy, rt).stage_times(step)[0]) > sum(StepCost(bare, strategy, rt).stage_times(step)[0])



@pytest.mark.parametrize("tp, padding", [
    # gpt-oss (hidden 2880, expert intermediate 2880) split tp ways; Marlin pads to 128 and 256
    (1, 2944 * 3072 / (2880 * 2880)),
    (2, 1536 * 3072 / (1440 * 2880)),
    (4, 768 * 3072 / (720 * 2880)),
    (8, 384 * 3072 / (360 * 2880)),
])
def test_vllm_holds_mxfp4_experts_padded_to_marlins_tiles(tp, padding):
    assert vllm_mxfp4_padding("vllm", "mxfp4", "h200", 2880, 2880, tp) == pytest.approx(padding)
    assert marlin_padding(2880, 2880 // tp) == pytest.approx(padding)


def test_only_vllms_mxfp4_experts_on_hopper_are_padded():
    assert marlin_padding(256, 128) == 1.0  # already on the tiles
    assert marlin_padding(100, 64) == 256 * 128 / (100 * 64)
    assert vllm_mxfp4_padding("vllm", "mxfp4", "h100-sxm", 2880, 2880, 1) > 1.0
    assert vllm_mxfp4_padding("vllm", "int4_g32", "h200", 2880, 2880, 1) == 1.0
    assert vllm_mxfp4_padding("trtllm", "mxfp4", "h200", 2880, 2880, 1) == 1.0
    assert vllm_mxfp4_padding("sglang", "mxfp4", "h200", 2880, 2880, 1) == 1.0
    assert vllm_mxfp4_padding("vllm", "mxfp4", "b200", 2880, 2880, 1) == 1.0
    assert vllm_mxfp4_padding("vllm", None, "h200", 2880, 2880, 1) == 1.0
    with pytest.raises(ValueError, match="layout"):
        vllm_mxfp4_padding("vllm", "mxfp4", "h200", 2880, 2880, 7)
    with pytest.raises(ValueError, match="positive"):
        marlin_padding(0, 64)


def test_a_gpt_oss_row_is_priced_with_its_padded_experts():
    def padding_of(**kw):
        case = map_row(_row(model_path="openai/gpt-oss-120b", precision="fp4", **kw))
        assert not case.skip, case.skip
        return case.ctx.workload.expert_weight_bytes / FORMAT_BYTES["mxfp4"]

    assert padding_of() == pytest.approx(384 * 3072 / (360 * 2880))  # TP 8
    assert padding_of(system="h100_sxm", tp_size=1, moe_tp_size=1) == pytest.approx(2944 * 3072 / (2880 * 2880))
    assert padding_of(backend="trtllm") == 1.0


def test_kv_capacity_prices_the_padded_experts_as_the_study_does():
    from validation.studies.serving.kv_capacity import load_rows, price_row

    rows = [price_row(p) for p in load_rows(Path("validation/data/kv_capacity_published.csv"))]
    oss = [p for p in rows if "gpt-oss-20b" in p.row["model_path"] and p.row["tp_size"] == "2"]
    assert len(oss) == 1 and oss[0].sim_weights_gib is not None
    # Marlin's padding at TP 2 (+13.8% of the experts) against the 7.01 GiB the log shows
    assert oss[0].sim_weights_gib == pytest.approx(7.01, rel=0.02)


def test_pools_that_pad_their_experts_differently_are_refused_in_one_line():
    row = _row(model_path="openai/gpt-oss-120b", precision="fp4", mode="disagg", prefill_num_workers=1,
               decode_num_workers=1, prefill_tp_size=1, prefill_moe_tp_size=1, prefill_attention_dp_size=1,
               prefill_moe_ep_size=1, decode_tp_size=8, decode_moe_tp_size=8, decode_attention_dp_size=1,
               decode_moe_ep_size=1, prefill_batch_size=4, decode_batch_size=4)
    case = map_row(row)
    assert case.skip.startswith("layout: the pools split their MXFP4 experts"), case.skip
    assert "\n" not in case.skip
    same = map_row({**row, "prefill_tp_size": "8", "prefill_moe_tp_size": "8"})
    assert not same.skip, same.skip
