"""The serving runtimes' grouped expert-GEMM efficiency: where it applies, and the fit that sets it."""

from __future__ import annotations

import csv

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import GroupBatch, ServingInputError, StepCost, get_runtime
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload
from validation.studies.moe import fit_kernels as fit_moe_kernels


def _cost(model: str, efficiency: float | None, tp: int = 8) -> StepCost:
    ctx = CostContext(get_model(model), Workload(precision="fp8"), Cluster.simple("h200", 8))
    rt = None if efficiency is None else get_runtime("trtllm").with_overrides(moe_gemm_efficiency=efficiency)
    return StepCost(ctx, megatron_strategy(tp=tp), rt)


def _step_s(cost: StepCost, batch: GroupBatch) -> float:
    return sum(cost.stage_times([batch])[0])


PREFILL = GroupBatch.of([(8192, 0)], [], 1)
DECODE = GroupBatch.of([], [1000] * 4, 4)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_an_efficiency_outside_zero_one_is_a_one_line_error(bad):
    with pytest.raises(ServingInputError, match="moe_gemm_efficiency"):
        get_runtime("vllm").with_overrides(moe_gemm_efficiency=bad)


def test_efficiency_one_prices_experts_as_the_lowering_does():
    """At 1 the runtime leaves the expert GEMMs as the runtime-free lowering (the proxy's) prices them."""
    plain, one = _cost("deepseek-v3", None), _cost("deepseek-v3", 1.0)
    assert one.runtime.expert_flops_per_s(one.gpu, "fp8") is None
    assert _expert_times(one, 8192) == _expert_times(plain, 8192)


def _expert_times(cost: StepCost, tokens: int) -> list[float]:
    """The expert GEMM tasks of one MoE layer as ``cost`` lowers a step of ``tokens`` tokens."""
    from simcore.serving.step_cost import _NoAttention

    low = _NoAttention(cost.ctx, cost._arrays, "prefill", cost.w.input_len)
    low.tokens, low.seqs = float(tokens), 1.0
    if cost.runtime is not None:
        low.expert_flops_per_s = cost.runtime.expert_flops_per_s(low.gpu, cost.w.precision)
    return [float(t.time_s) for t in low.layer(moe=True) if t.name.startswith("expert_ffn")]


def test_a_slower_expert_kernel_slows_a_long_prefill_far_more_than_a_small_decode():
    """Compute-bound experts (8192 tokens) slow by up to 1 / efficiency; a 4-sequence decode step's useful
    expert work is tiny, its weights' reads set its time, and it does not move."""
    fast, slow = _cost("deepseek-v3", 1.0), _cost("deepseek-v3", 0.4)
    experts = sum(_expert_times(slow, 8192)) / sum(_expert_times(fast, 8192))
    assert 1.3 < experts <= 1 / 0.4 + 1e-9
    assert _step_s(slow, PREFILL) > 1.1 * _step_s(fast, PREFILL)
    assert _step_s(slow, DECODE) == pytest.approx(_step_s(fast, DECODE), rel=1e-12)


def test_a_dense_model_is_untouched():
    assert _step_s(_cost("llama-3.1-70b", 0.4), PREFILL) == _step_s(_cost("llama-3.1-70b", 1.0), PREFILL)


def test_the_kernel_timings_bound_the_serving_profiles_from_above():
    """The published Triton fused_moe timings (BF16, Mixtral's and Gemma-4's shapes) give 0.35; the vLLM and
    SGLang profiles carry what their serving fit rows' prefill wants (``fit_serving --moe-prefill``: 0.25,
    0.18), which is no faster: the serving shapes split each expert over the tensor-parallel GPUs."""
    result = fit_moe_kernels.main([])
    assert result["moe_gemm_efficiency"] == 0.35
    assert result["median_abs_log_error"] < result["median_abs_log_error_at_1"]
    for name in ("vllm", "vllm-sync", "sglang"):
        assert get_runtime(name).moe_gemm_efficiency <= result["moe_gemm_efficiency"]


def test_triton_runs_fp8_experts_at_the_bf16_rate_and_cutlass_at_fp8s():
    """``moe_fp8_at_bf16_rate``: vLLM's and SGLang's FP8 experts get BF16's tensor-core rate (times their
    efficiency), TensorRT-LLM's FP8's; BF16 experts are priced the same either way."""
    from simcore.hardware.gpus import get_gpu

    gpu = get_gpu("h200")
    bf16 = gpu.peak_flops_per_s["bf16"] * gpu.gemm_efficiency["bf16"]
    fp8 = gpu.peak_flops_per_s["fp8"] * gpu.gemm_efficiency["fp8"]
    for name in ("vllm", "sglang"):
        rt = get_runtime(name)
        assert rt.moe_fp8_at_bf16_rate
        assert rt.expert_flops_per_s(gpu, "fp8") == pytest.approx(bf16 * rt.moe_gemm_efficiency)
        assert rt.expert_flops_per_s(gpu, "bf16") == pytest.approx(bf16 * rt.moe_gemm_efficiency)
        off = rt.with_overrides(moe_fp8_at_bf16_rate=False)
        assert off.expert_flops_per_s(gpu, "fp8") == pytest.approx(fp8 * rt.moe_gemm_efficiency)
    trt = get_runtime("trtllm")
    assert not trt.moe_fp8_at_bf16_rate
    assert trt.expert_flops_per_s(gpu, "fp8") == pytest.approx(fp8 * trt.moe_gemm_efficiency)
    # the flag alone (efficiency 1) still takes the runtime's own rate for FP8 experts
    assert get_runtime("trtllm").with_overrides(moe_gemm_efficiency=1.0, moe_fp8_at_bf16_rate=True) \
        .expert_flops_per_s(gpu, "fp8") == pytest.approx(bf16)


def test_trtllm_value_is_what_the_fit_chooses_on_the_measured_cutlass_grouped_gemms():
    """TensorRT-LLM's value comes from this project's H100 timings of CUTLASS grouped GEMMs at prefill sizes."""
    result = fit_moe_kernels.main(["--runtime", "trtllm"])
    assert result["moe_gemm_efficiency"] == get_runtime("trtllm").moe_gemm_efficiency
    assert result["rows"] >= 60 and result["median_abs_log_error"] < result["median_abs_log_error_at_1"]


def test_the_grouped_loader_takes_one_dtype_and_names_a_bad_shape(tmp_path):
    rows = list(csv.DictReader(fit_moe_kernels._GROUPED_DATA.open()))
    loaded = fit_moe_kernels.load_grouped_rows(fit_moe_kernels._GROUPED_DATA)
    assert loaded and {r["precision"] for r in loaded} == {"bf16"} and {r["gpu"] for r in loaded} == {"h100-sxm"}
    assert len(fit_moe_kernels.load_grouped_rows(fit_moe_kernels._GROUPED_DATA, "FP8 e4m3")) == len(rows) - len(loaded)
    path = tmp_path / "g.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([rows[0], dict(rows[1], shape_or_size="b=8 m=4 n=512")])
    with pytest.raises(SystemExit, match="line 3: shape_or_size"):
        fit_moe_kernels.load_grouped_rows(path)


def test_the_fit_refuses_test_rows_and_names_a_bad_value(tmp_path):
    rows = list(csv.DictReader(fit_moe_kernels._DATA.open()))
    big = [r for r in rows if int(r["M_tokens"]) >= 1024][:2]
    path = tmp_path / "t.csv"

    def write(rows):
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    write([dict(big[0], split="test"), big[1]])
    with pytest.raises(SystemExit, match="test row"):
        fit_moe_kernels.main(["--data", str(path)])
    with pytest.raises(SystemExit, match="--data .*missing.csv"):
        fit_moe_kernels.main(["--data", str(tmp_path / "missing.csv")])
    write([dict(big[0], time_us="fast"), big[1]])
    with pytest.raises(SystemExit, match="line 2"):
        fit_moe_kernels.main(["--data", str(path)])


@pytest.mark.parametrize("flag", ["--tokens", "--experts"])
def test_the_timing_script_refuses_a_count_below_one_before_looking_for_a_gpu(tmp_path, flag):
    from validation.studies.moe import measure_kernels as measure_moe
    with pytest.raises(SystemExit) as exc:
        measure_moe.main(["--out", str(tmp_path / "m.csv"), flag, "4", "0"])
    assert exc.value.code == 2


@pytest.mark.parametrize("ops", ["10", "many"])
def test_the_launch_timer_refuses_a_bad_count_before_looking_for_a_gpu(tmp_path, ops):
    from validation.studies.serving import measure_launch
    with pytest.raises(SystemExit) as exc:
        measure_launch.main(["--out", str(tmp_path / "l.csv"), "--ops", ops])
    assert exc.value.code == 2


def test_sglang_deepep_prices_deepgemm_grouped_gemms_at_their_published_dense_rate():
    """Profile sglang-deepep: DeepGEMM's grouped GEMMs (contiguous layout) over its dense GEMMs of the same
    n x k, from its README (validation/data/kernels_deepgemm_published.csv), is the profile's rate; FP8 on
    FP8 tensor cores, DeepEP all-to-alls, the 0.8 static memory fraction; everything else SGLang's."""
    import dataclasses
    import statistics
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "validation" / "data" / "kernels_deepgemm_published.csv"
    rows = list(csv.DictReader(path.read_text().splitlines()))
    dense = {(r["n"], r["k"]): float(r["tflops"]) for r in rows if r["layout"] == "dense"}
    ratios = [float(r["tflops"]) / dense[r["n"], r["k"]] for r in rows if r["layout"] == "contiguous"]
    assert len(ratios) == 4 and all(r["source_url"].startswith("https://github.com/deepseek-ai/DeepGEMM") for r in rows)
    deepep, sglang = get_runtime("sglang-deepep"), get_runtime("sglang")
    assert deepep.moe_gemm_efficiency == pytest.approx(min(statistics.median(ratios), 1.0), abs=0.05)
    assert not deepep.moe_fp8_at_bf16_rate and sglang.moe_fp8_at_bf16_rate
    assert deepep.mem_fraction == 0.8 and sglang.mem_fraction is None  # the DeepEP launches' static fraction
    assert dataclasses.replace(deepep, name="sglang", moe_gemm_efficiency=sglang.moe_gemm_efficiency,
                               moe_fp8_at_bf16_rate=True, moe_a2a_backend="none", mem_fraction=None) == sglang


def _decode_rows_priced_at(efficiency: float, fixed_s: float) -> list[dict]:
    """The shipped decode-size fused_moe rows with their times replaced by the model's at one grid point."""
    runtime = get_runtime("vllm").with_overrides(moe_memory_efficiency=efficiency, moe_layer_s=fixed_s)
    loaded = {r["line"]: r for r in fit_moe_kernels.load_rows(fit_moe_kernels._DATA) if r["tokens"] <= 64}
    raw = list(csv.DictReader(fit_moe_kernels._DATA.open()))
    return [dict(raw[line - 2], time_us=f"{fit_moe_kernels.decode_call_s(r, runtime) * 1e6:.6f}")
            for line, r in loaded.items()]


def _write(path, rows) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_the_decode_fit_recovers_the_constants_that_priced_its_rows(tmp_path):
    path = tmp_path / "decode.csv"
    _write(path, _decode_rows_priced_at(0.7, 30e-6))
    result = fit_moe_kernels.main(["--decode", "--data", str(path)])
    assert (result["moe_memory_efficiency"], result["moe_layer_s"]) == (0.7, pytest.approx(30e-6))
    assert result["median_abs_log_error"] < 1e-6
    assert result["shipped"]["vllm"]["median_abs_log_error"] > 0.01  # the serving fit's values are another point


def test_the_decode_fit_takes_only_decode_rows_refuses_test_rows_and_names_a_bad_flag(tmp_path):
    path = tmp_path / "decode.csv"
    rows = _decode_rows_priced_at(1.0, 20e-6)
    _write(path, [dict(rows[0], split="test"), *rows[1:]])
    with pytest.raises(SystemExit, match="test row"):
        fit_moe_kernels.main(["--decode", "--data", str(path)])
    with pytest.raises(SystemExit, match="no usable fused_moe row with at most 0 tokens"):
        fit_moe_kernels.main(["--decode", "--data", str(path), "--max-tokens", "0", "--no-fit"])
    with pytest.raises(SystemExit, match="--decode"):
        fit_moe_kernels.main(["--decode", "--runtime", "trtllm"])


def test_the_decode_price_of_a_call_is_the_lowerings_expert_gemms_plus_the_fixed_time():
    row = next(r for r in fit_moe_kernels.load_rows(fit_moe_kernels._DATA) if r["tokens"] == 4)
    base = get_runtime("vllm").with_overrides(moe_memory_efficiency=1.0, moe_layer_s=0.0)
    gemms = fit_moe_kernels.decode_call_s(row, base)
    assert gemms == pytest.approx(fit_moe_kernels.fused_moe_s(row["gpu_spec"], 4, row["E"], row["N"], row["hidden_K"],
                                                              row["topk"], row["precision"], base.moe_gemm_efficiency))
    assert fit_moe_kernels.decode_call_s(row, base.with_overrides(moe_layer_s=25e-6)) == pytest.approx(gemms + 25e-6)
    halved = fit_moe_kernels.decode_call_s(row, base.with_overrides(moe_memory_efficiency=0.5))
    assert 1.5 * gemms < halved <= 2.0 * gemms  # weight reads dominate a 4-token call


@pytest.mark.parametrize("module", ["validation.studies.moe.fit_kernels", "validation.studies.kernels.fit", "validation.studies.inference.fit",
                                    "validation.studies.inference.compare_measured"])
def test_a_fitting_script_given_a_missing_file_says_one_line_and_exits_2(tmp_path, module):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", module, "--data", str(tmp_path / "missing.csv")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "missing.csv" in done.stderr
