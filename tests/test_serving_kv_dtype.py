"""The KV cache's element type: a workload field of its own, and which one each measured row ran with."""

import dataclasses

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import runtime_strategy
from simcore.serving.kvcache import kv_capacity_tokens
from simcore.serving.runtime import get_runtime
from simcore.serving.step_cost import GroupBatch, StepCost
from simcore.workload import Workload
from validation.studies.serving.launch import kv_cache_precision
from validation.studies.serving.mapping import map_row


def test_kv_precision_defaults_to_the_weights_and_is_validated():
    assert Workload(precision="fp8").kv_bytes == 1.0
    assert Workload(precision="fp8", kv_precision="bf16").kv_bytes == 2.0
    assert Workload(precision="bf16", kv_precision="fp8").kv_bytes == 1.0
    with pytest.raises(ValueError, match="workload.kv_precision: 'int4'"):
        Workload(kv_precision="int4")


def _ctx(kv: str) -> CostContext:
    cluster = Cluster.simple("h200", num_gpus=8, nvlink_domain_size=8)
    return CostContext(get_model("llama-3.1-8b"), Workload(precision="fp8", kv_precision=kv), cluster)


def test_a_bf16_kv_cache_holds_half_the_tokens_and_costs_more_decode_attention():
    runtime = get_runtime("sglang")
    strategy = runtime_strategy(tp=1)
    fp8, bf16 = _ctx("fp8"), _ctx("bf16")
    cap8 = kv_capacity_tokens(fp8, strategy, runtime)
    cap16 = kv_capacity_tokens(bf16, strategy, runtime)
    assert cap16 == pytest.approx(cap8 / 2, rel=0.01)
    decode = GroupBatch([], 256, 256 * 2000.0, 256)  # 256 sequences at 2000 tokens of context
    a8 = StepCost(fp8, strategy, runtime).attention_s(decode)
    a16 = StepCost(bf16, strategy, runtime).attention_s(decode)
    assert 1.8 < a16 / a8 <= 2.0  # KV reads dominate decode attention; the queries stay 16-bit
    # the weights' GEMMs do not change: only attention does
    t8 = StepCost(fp8, strategy, runtime).gpu_times([decode], runtime)[0]
    t16 = StepCost(bf16, strategy, runtime).gpu_times([decode], runtime)[0]
    assert t16 - t8 == pytest.approx(32 * (a16 - a8), rel=0.02)


@pytest.mark.parametrize(("backend", "version", "model", "preset", "isl", "osl", "kv"), [
    ("sglang", "0.5.9", "deepseek-ai/DeepSeek-R1", "deepseek-r1", 8192, 1024, "bf16"),  # dsr1_fp8_h200.sh: auto
    ("trtllm", "1.1.0", "deepseek-ai/DeepSeek-R1", "deepseek-r1", 8192, 1024, "fp8"),  # kv_cache_config dtype fp8
    ("trtllm", "1.1.0", "deepseek-ai/DeepSeek-R1", "deepseek-r1", 8000, 1000, "bf16"),  # not InferenceX: auto
    ("vllm", "", "meta-llama/Llama-3.1-70B", "llama-3.1-70b", 1024, 1024, "fp8"),  # kv-cache-dtype: fp8
    ("sglang", "0.5.9", "Qwen/Qwen3.5-397B-A17B", "qwen3.5-397b-a17b", 1024, 8192, "fp8"),  # fp8_e4m3
    ("vllm", "0.16.0", "MiniMaxAI/MiniMax-M2.5", "minimax-m2.5", 1024, 1024, "bf16"),  # copy without the flag
    ("vllm", "0.12.0", "Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b", 1000, 100, "bf16"),  # block FP8: auto
    ("sglang", "0.5.6", "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", 1000, 100, "bf16"),
    ("vllm", "0.12.0", "nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b", 1000, 100, "bf16"),  # before #30785
    ("vllm", "0.14.0", "nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b", 1000, 100, "fp8"),
    ("sglang", "0.5.6", "nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b", 1000, 100, "fp8"),
    ("trtllm", "1.1.0", "nvidia/Llama-3.3-70B-Instruct-FP8", "llama-3.1-70b", 1000, 100, "fp8"),
])
def test_each_rows_kv_cache_type_is_its_launch_flag_or_its_runtimes_auto(backend, version, model, preset,
                                                                          isl, osl, kv):
    assert kv_cache_precision(backend, version, model, preset, "fp8", isl, osl) == kv


def test_bf16_weights_keep_a_bf16_kv_cache_and_rows_carry_the_type():
    assert kv_cache_precision("trtllm", "1.1.0", "openai/gpt-oss-120b", "gpt-oss-120b", "bf16", 1024, 1024) == "bf16"
    row = {"source_url": "x", "id": "r", "backend": "sglang", "backend_version": "0.5.9", "system": "h200_sxm",
           "model_path": "deepseek-ai/DeepSeek-R1", "precision": "fp8", "mode": "agg", "isl": "8192",
           "osl": "1024", "batch_size": "4", "tp_size": "8", "attention_dp_size": "1", "moe_tp_size": "8",
           "moe_ep_size": "1", "silicon_ttft_ms": "100", "silicon_tpot_ms": "10",
           "silicon_data_source": "x; silicon_concurrency=4"}
    case = map_row(row)
    assert not case.skip and (case.ctx.workload.precision, case.ctx.workload.kv_precision) == ("fp8", "bf16")
    trt = map_row(dict(row, backend="trtllm", backend_version="1.1.0"))
    assert not trt.skip and trt.ctx.workload.kv_precision == "fp8"
    assert dataclasses.replace(case.ctx.workload, kv_precision=None).kv_bytes == 1.0


def test_launch_configurations_ask_for_the_kv_cache_type_the_plan_was_priced_with():
    import yaml

    from simcore.export.serving import serving_launch
    from simcore.serving import ServingPlan

    model = get_model("llama-3.1-70b")
    plan = ServingPlan.aggregated(runtime_strategy(tp=4), workers=1, max_num_seqs=64)
    for kv, vllm_flag, sglang_flag, trt_dtype in (("fp8", "--kv-cache-dtype fp8", "--kv-cache-dtype fp8_e4m3", "fp8"),
                                                  ("bf16", "--kv-cache-dtype auto", "--kv-cache-dtype auto", None)):
        vllm = serving_launch(plan, model, "vllm", precision="fp8", kv_precision=kv).to_text()
        sglang = serving_launch(plan, model, "sglang", precision="fp8", kv_precision=kv).to_text()
        trt = serving_launch(plan, model, "trtllm", precision="fp8", kv_precision=kv)
        assert vllm_flag in vllm and "--quantization fp8" in vllm
        assert sglang_flag in sglang
        options = yaml.safe_load(next(iter(v for k, v in trt.files.items() if k.startswith("trtllm_both"))))
        assert options["kv_cache_config"].get("dtype") == trt_dtype
    # no KV type given: as the weights, as before
    assert "--kv-cache-dtype fp8" in serving_launch(plan, model, "vllm", precision="fp8").to_text()
