"""Kernel time model (simcore.hardware.kernels) and its calibration script (validation.studies.kernels.fit)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.hardware.gpus import get_gpu
from simcore.hardware.kernels import (
    DECODE_ATTENTION_FILL_S,
    attention_time_s,
    gemm_bytes,
    gemm_flops,
    gemm_time_s,
    memory_time_s,
)
from validation.studies.kernels import fit as fit_kernels
from validation.studies.kernels.model import predicted_over_measured
from validation.studies.kernels.rows import DEFAULT_DATA, load_samples

# Round numbers so every expectation below is hand-computable and independent of the fitted defaults.
GPU = get_gpu("h100-sxm").with_overrides(gemm_tile=128, gemm_efficiency={"bf16": 0.8, "fp8": 0.7},
                                         hbm_efficiency=0.9, attention_efficiency=0.5, kernel_overhead_s=5e-6)
HBM = 3.35e12 * 0.9
PEAK = {"bf16": 989.4e12 * 0.8, "fp8": 1978.9e12 * 0.7}
SM_RATE = {p: rate / 132 for p, rate in PEAK.items()}

dims = st.floats(min_value=1.0, max_value=65536.0, allow_nan=False)
counts = st.integers(min_value=1, max_value=256)
precisions = st.sampled_from(["bf16", "fp8"])


def test_flops_and_bytes_by_hand():
    assert gemm_flops(2, 3, 4, count=5) == 2 * 2 * 3 * 4 * 5
    # bf16: weights 4*3*2 + input 2*4*2 + output 2*3*2 = 24 + 16 + 12; fp8 halves weights and input only
    assert gemm_bytes(2, 3, 4, "bf16") == 52
    assert gemm_bytes(2, 3, 4, "fp8", count=2) == 2 * (12 + 8 + 12)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_one_full_wave_is_flops_over_peak_times_efficiency(precision):
    m, n, k = 128 * 12, 128 * 11, 8192  # exactly 132 tiles of 128 x 128: one full wave, compute bound
    expected = 2 * m * n * k / PEAK[precision] + 5e-6
    assert gemm_time_s(m, n, k, GPU, precision) == pytest.approx(expected, rel=1e-12)
    # one more row of tiles (143 tiles) needs a second wave: twice the compute
    expected_two_waves = 2 * (2 * 128 * 128 * k / SM_RATE[precision]) + 5e-6
    assert gemm_time_s(m + 1, n, k, GPU, precision) == pytest.approx(expected_two_waves, rel=1e-12)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_huge_square_gemm_approaches_peak_times_efficiency(precision):
    size = 32768
    achieved = gemm_flops(size, size, size) / gemm_time_s(size, size, size, GPU, precision)
    assert 0.995 * PEAK[precision] < achieved <= PEAK[precision]


@pytest.mark.parametrize(("precision", "elem"), [("bf16", 2), ("fp8", 1)])
def test_decode_gemm_is_memory_bound(precision, elem):
    n = k = 8192  # 64 tiles -> split-K over 2 SMs each: compute 2*128*128*4096 / SM rate << memory time
    weight_and_act_bytes = k * n * elem + k * elem + n * 2
    expected = weight_and_act_bytes / HBM + 5e-6
    assert gemm_time_s(1, n, k, GPU, precision) == pytest.approx(expected, rel=1e-12)
    assert 2 * 128 * 128 * 4096 / SM_RATE[precision] < weight_and_act_bytes / HBM


def test_split_k_spreads_one_tile_over_all_sms():
    k = 128 * 132 * 4  # one 128 x 128 tile, k split 132 ways -> each SM does 512 of k
    expected_compute = 2 * 128 * 128 * 512 / SM_RATE["bf16"]
    no_memory = GPU.with_overrides(hbm_efficiency=1.0, hbm_bandwidth_bytes_per_s=1e30)
    assert gemm_time_s(128, 128, k, no_memory, "bf16") == pytest.approx(expected_compute + 5e-6, rel=1e-12)


def test_grouped_gemm_counts_tiles_and_weights_of_every_group():
    one = gemm_time_s(4096, 4096, 4096, GPU, "fp8")
    eight = gemm_time_s(4096, 4096, 4096, GPU, "fp8", count=8)
    assert gemm_flops(4096, 4096, 4096, count=8) == 8 * gemm_flops(4096, 4096, 4096)
    assert 7.5 * (one - 5e-6) < eight - 5e-6 <= 8 * (one - 5e-6)  # fewer partial waves, never more work


def test_attention_and_memory_kernels_by_hand():
    assert attention_time_s(1e12, 1e6, GPU, "bf16") == pytest.approx(1e12 / (989.4e12 * 0.5) + 5e-6)
    assert attention_time_s(1e9, 1e10, GPU, "fp8") == pytest.approx(1e10 / HBM + 5e-6)  # memory bound
    assert memory_time_s(1e9, GPU) == pytest.approx(1e9 / HBM + 5e-6)
    assert memory_time_s(0.0, GPU) == pytest.approx(5e-6)


def test_unknown_precision_is_rejected():
    with pytest.raises(ValueError, match="precision"):
        gemm_time_s(1, 1, 1, GPU, "fp32")
    with pytest.raises(ValueError, match="precision"):
        attention_time_s(1.0, 1.0, GPU, "int4")


def test_vectorized_call_equals_scalar_calls():
    rng = np.random.default_rng(0)
    m, n, k = (rng.integers(1, 20000, size=200).astype(float) for _ in range(3))
    count = rng.integers(1, 64, size=200)
    for precision in ("bf16", "fp8"):
        vector = gemm_time_s(m, n, k, GPU, precision, count)
        scalar = [gemm_time_s(*args, GPU, precision, c) for *args, c in zip(m, n, k, count, strict=True)]
        assert vector.dtype == np.float64 and vector.shape == (200,)
        np.testing.assert_array_equal(vector, np.array(scalar))
    flops, size = rng.uniform(1e6, 1e13, 50), rng.uniform(1e3, 1e10, 50)
    scalar = [attention_time_s(f, b, GPU, "bf16") for f, b in zip(flops, size, strict=True)]
    np.testing.assert_array_equal(attention_time_s(flops, size, GPU, "bf16"), scalar)
    np.testing.assert_array_equal(memory_time_s(size, GPU), [memory_time_s(b, GPU) for b in size])


def test_broadcasting_and_scalar_types():
    out = gemm_time_s(np.array([[1.0], [4096.0]]), np.array([1024.0, 8192.0, 16384.0]), 4096, GPU, "bf16")
    assert out.shape == (2, 3)
    scalar = gemm_time_s(1, 4096, 4096, GPU, "bf16")
    assert isinstance(scalar, float) and isinstance(memory_time_s(1e6, GPU), float)


@settings(max_examples=200, deadline=None)
@given(m=dims, n=dims, k=dims, count=counts, precision=precisions,
       grow=st.sampled_from(["m", "n", "k", "count"]), factor=st.floats(min_value=1.0, max_value=8.0))
def test_gemm_time_is_monotonic(m, n, k, count, precision, grow, factor):
    base = {"m": m, "n": n, "k": k, "count": count}
    bigger = dict(base, **{grow: base[grow] * factor if grow != "count" else math.ceil(count * factor)})
    before = gemm_time_s(gpu=GPU, precision=precision, **base)
    assert gemm_time_s(gpu=GPU, precision=precision, **bigger) >= before


@settings(max_examples=200, deadline=None)
@given(m=st.floats(min_value=1e-3, max_value=1e7), n=dims, k=dims, count=counts, precision=precisions,
       flops=st.floats(min_value=1e-3, max_value=1e18), size=st.floats(min_value=1e-3, max_value=1e13))
def test_times_are_finite_and_positive(m, n, k, count, precision, flops, size):
    gpu = get_gpu("h100-sxm")  # the shipped, fitted defaults
    for value in (gemm_time_s(m, n, k, gpu, precision, count), attention_time_s(flops, size, gpu, precision),
                  memory_time_s(size, gpu)):
        assert math.isfinite(value) and value >= gpu.kernel_overhead_s > 0
    achieved = gemm_flops(m, n, k, count) / gemm_time_s(m, n, k, gpu, precision, count)
    assert achieved <= gpu.peak_flops_per_s[precision] * gpu.gemm_efficiency[precision] * (1 + 1e-9)


# --- calibration script -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped_fit():
    summary = fit_kernels.main(["--no-rows"])
    return summary


def test_fit_uses_the_fit_rows_and_no_constant_beats_it_there(shipped_fit):
    """Behaviour, not a headline: the fit reads every usable fit row, and moving any fitted constant
    away from its value raises the fit's own cost on those rows (it is a minimum)."""
    assert shipped_fit["rows_used"] == 443 and shipped_fit["rows_skipped"] == 408
    assert any("FP32" in reason and count == 375 for reason, count in shipped_fit["skipped"].items())
    assert set(shipped_fit["by_split"]) == {"fit"}
    samples, _ = load_samples(DEFAULT_DATA)
    gpu = get_gpu("h100-sxm")
    p = shipped_fit["params"]
    fitted = gpu.with_overrides(gemm_efficiency={"bf16": p["gemm_efficiency_bf16"], "fp8": p["gemm_efficiency_fp8"]},
                                hbm_efficiency=p["hbm_efficiency"], attention_efficiency=p["attention_efficiency"],
                                kernel_overhead_s=p["kernel_overhead_s"])

    def cost(g):
        ratio = predicted_over_measured([s for s in samples if not s.decode], g)
        return float(np.sum(np.log(ratio) ** 2))

    for field, value in (("hbm_efficiency", p["hbm_efficiency"]), ("attention_efficiency", p["attention_efficiency"])):
        for factor in (0.9, 1.1):
            assert cost(fitted.with_overrides(**{field: value * factor})) > cost(fitted), (field, factor)


def test_decode_fill_is_the_median_residual_of_decode_rows(tmp_path):
    """Hand-made decode rows that take a known 20 us beyond the kernel model give a 20 us fill."""
    gpu = get_gpu("h100-sxm")
    rows = []
    for s in (64, 512, 4096):
        flops, size = 4.0 * 8 * 32 * s * 128, 2.0 * 8 * 128 * (2 * 32 + 2 * 8 * s)
        seconds = float(attention_time_s(flops, size, gpu, "bf16")) + 20e-6
        rows.append(("FlashAttention decode", f"B=8 H=32 Hkv=8 Sq=1 S={s} D=128", "BF16", f"{seconds * 1e6:.6f}", "us"))
    _write_csv(tmp_path / "decode.csv", rows)
    samples, _ = load_samples(tmp_path / "decode.csv")
    assert all(s.decode for s in samples)
    assert fit_kernels.fit_decode_fill(samples, gpu) == pytest.approx(20e-6, rel=1e-4)
    assert float(attention_time_s(1.0, 1.0, gpu, "bf16", decode=True) - attention_time_s(1.0, 1.0, gpu, "bf16")) \
        == pytest.approx(DECODE_ATTENTION_FILL_S)


def test_fit_output_ends_with_json_and_is_deterministic(capsys):
    first = fit_kernels.main(["--no-rows"])
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last_line) == json.loads(json.dumps(first))
    assert fit_kernels.main(["--no-rows"]) == first


def test_hardware_defaults_are_the_fitted_values(shipped_fit):
    params, gpu = shipped_fit["params"], get_gpu("h100-sxm")
    assert gpu.gemm_tile == params["gemm_tile"]
    assert gpu.gemm_efficiency["bf16"] == pytest.approx(params["gemm_efficiency_bf16"], abs=0.006)
    assert gpu.gemm_efficiency["fp8"] == pytest.approx(params["gemm_efficiency_fp8"], abs=0.006)
    assert gpu.hbm_efficiency == pytest.approx(params["hbm_efficiency"], abs=0.006)
    assert gpu.attention_efficiency == pytest.approx(params["attention_efficiency"], abs=0.006)
    assert gpu.kernel_overhead_s == pytest.approx(params["kernel_overhead_s"], abs=0.06e-6)
    assert params["decode_attention_fill_s"] == pytest.approx(DECODE_ATTENTION_FILL_S, abs=0.06e-6)


def test_fit_refuses_test_rows_and_scores_them_per_split(capsys):
    with pytest.raises(SystemExit, match="test row"):
        fit_kernels.main(["--no-rows", "--data", str(DEFAULT_DATA.parent / "kernels_h100_measured.csv")])
    scored = fit_kernels.main(["--no-rows", "--no-fit", "--data", str(DEFAULT_DATA),
                               str(DEFAULT_DATA.parent / "kernels_h100_measured.csv")])
    assert set(scored["by_split"]) == {"fit", "test"}
    assert scored["by_split"]["test"]["attention"]["rows"] == 12
    assert "test (out of sample), 307 rows" in capsys.readouterr().out


def _write_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["source_url", "kernel", "shape_or_size", "dtype", "metric", "value", "unit", "note"])
        for kernel, shape, dtype, value, unit in rows:
            writer.writerow(["https://example.invalid", kernel, shape, dtype, "achieved", value, unit, ""])


def test_fit_recovers_known_parameters_from_synthetic_data(tmp_path):
    truth = get_gpu("h100-sxm").with_overrides(gemm_tile=128, gemm_efficiency={"bf16": 0.7, "fp8": 0.6},
                                               hbm_efficiency=0.85, attention_efficiency=0.6,
                                               kernel_overhead_s=3e-6)
    rows = []
    for precision, dtype in (("bf16", "BF16"), ("fp8", "FP8")):
        for m, n, k in [(1, 8192, 8192), (64, 4096, 7168), (512, 1024, 1024), (2048, 2048, 4096),
                        (4096, 7168, 2048), (8192, 8192, 8192), (300, 5000, 3000), (1, 1024, 1024)]:
            seconds = gemm_time_s(m, n, k, truth, precision)
            rows.append(("cuBLAS GEMM", f"{m}x{n}x{k} (MxNxK)", dtype, f"{seconds * 1e6:.6f}", "us"))
    for size in (1e6, 1e8, 4e9):
        rows.append(("HBM bandwidth (STREAM Copy)", f"{size:.0f} bytes", "BF16",
                     f"{size / memory_time_s(size, truth) / 1e9:.6f}", "GB/s"))
    for b, s in [(32, 512), (4, 4096), (1, 16384)]:
        flops, size = 4 * b * 16 * s * s * 128, 4 * b * 16 * s * 128 * 2
        rate = flops / attention_time_s(flops, size, truth, "bf16")
        shape = f"B={b} H=16 S={s} D=128"
        rows.append(("FlashAttention-3 forward", shape, "BF16", f"{rate / 1e12:.6f}", "TFLOP/s"))
    rows.append(("XLA GPU dot", "b=2 m=128 n=128 k=128", "F32", "10", "TFLOP/s"))
    rows.append(("Mystery kernel", "?", "BF16", "10", "TFLOP/s"))
    _write_csv(tmp_path / "synthetic.csv", rows)
    samples, skipped = load_samples(tmp_path / "synthetic.csv")
    assert len(samples) == 22 and [reason[2][:5] for reason in skipped] == ["FP32/", "unrec"]
    fitted, cost = fit_kernels.fit(samples, get_gpu("h100-sxm"))
    assert fitted.gemm_tile == 128 and cost < 1e-10
    assert fitted.gemm_efficiency["bf16"] == pytest.approx(0.7, rel=1e-3)
    assert fitted.gemm_efficiency["fp8"] == pytest.approx(0.6, rel=1e-3)
    assert fitted.hbm_efficiency == pytest.approx(0.85, rel=1e-3)
    assert fitted.attention_efficiency == pytest.approx(0.6, rel=1e-3)
    assert fitted.kernel_overhead_s == pytest.approx(3e-6, rel=1e-2)


def test_loader_parses_shape_conventions_and_batches(tmp_path):
    _write_csv(tmp_path / "shapes.csv", [
        ("XLA GPU dot (batched GEMM)", "b=4 m=256 n=512 k=1024", "BF16 x BF16 -> BF16", "100", "TFLOP/s"),
        ("DeepGEMM grouped", "groups=8 M_per_group=4096 N=4096 K=7168", "FP8", "1300", "TFLOP/s"),
        ("DeepGEMM grouped", "groups=8 M_per_group=4096 N=4096 K=7168", "FP8", "500", "GB/s"),
        ("torch.matmul", "2048x1024x13312 (NxMxK)", "BF16", "700", "TFLOP/s"),
        ("HBM bandwidth (STREAM Dot)", "not stated", "not stated", "3.1", "TB/s"),
        ("FlashAttention 2.0", "batch 2, seqlen 8192, head dim 128", "not stated", "~330", "TFLOP/s"),
        ("nvbandwidth: Host to Device", "not stated", "n/a", "51", "GB/s"),
    ])
    samples, skipped = load_samples(tmp_path / "shapes.csv")
    expected_dims = [(256, 512, 1024, 4), (4096, 4096, 7168, 8), (1024, 2048, 13312, 1)]
    assert [s.dims for s in samples[:3]] == expected_dims
    assert samples[0].measured_s == pytest.approx(2 * 4 * 256 * 512 * 1024 / 100e12)
    assert samples[1].family == "gemm_fp8" and samples[2].family == "gemm_bf16"
    assert (samples[3].measured_s, samples[3].measured_rate, samples[3].bound) == (None, 3.1e12, "memory")
    assert (samples[4].measured_s, samples[4].measured_rate, samples[4].family) == (None, 330e12, "attention")
    assert [line for line, _kernel, _reason in skipped] == [4, 8]  # duplicate GB/s row, host copy


def test_attention_rows_with_decode_queries_and_grouped_kv_heads(tmp_path):
    _write_csv(tmp_path / "attn.csv", [
        ("Attention forward: flash", "B=2 H=8 S=1024 D=128 causal=1", "BF16", "100", "us"),
        ("Attention forward: flash", "B=64 H=64 Hkv=8 Sq=1 S=2048 D=128", "BF16", "200", "us"),
    ])
    samples, skipped = load_samples(tmp_path / "attn.csv")
    assert not skipped
    prefill, decode = samples
    assert prefill.flops == 4 * 2 * 8 * 1024 * 1024 * 128 * 0.5
    assert prefill.size_bytes == 4 * 2 * 8 * 1024 * 128 * 2
    assert decode.flops == 4 * 64 * 64 * 1 * 2048 * 128  # one query: no causal halving
    assert decode.size_bytes == 2 * 64 * 128 * (2 * 64 * 1 + 2 * 8 * 2048)  # q, o + K, V of 8 kv heads


def test_several_data_files_fit_together_and_no_fit_scores_the_catalog(tmp_path, capsys):
    _write_csv(tmp_path / "a.csv", [("cuBLAS GEMM", "m=4096 n=4096 k=4096", "BF16", "600", "TFLOP/s")])
    _write_csv(tmp_path / "b.csv", [("HBM copy", "size_bytes=4000000000", "BF16", "3000", "GB/s"),
                                    ("Mystery", "?", "BF16", "1", "us")])
    both = fit_kernels.main(["--no-rows", "--data", str(tmp_path / "a.csv"), str(tmp_path / "b.csv")])
    assert both["rows_used"] == 2 and both["rows_skipped"] == 1 and both["fitted"]
    scored = fit_kernels.main(["--no-rows", "--no-fit", "--data", str(tmp_path / "b.csv")])
    gpu = get_gpu("h100-sxm")
    assert not scored["fitted"] and scored["params"]["hbm_efficiency"] == gpu.hbm_efficiency
    expected = float(memory_time_s(4e9, gpu)) / (4e9 / 3000e9) - 1.0
    assert scored["families"]["hbm"]["median_rel_err"] == pytest.approx(expected, abs=1e-4)
    with pytest.raises(SystemExit, match="--data"):
        fit_kernels.main(["--no-rows", "--data", str(tmp_path / "missing.csv")])
    capsys.readouterr()


def test_shipped_h100_measurements_are_predicted_out_of_sample():
    """Our own H100 timings (validation/studies/kernels/measure.py) against the catalog fitted on published rows."""
    scored = fit_kernels.main(["--no-rows", "--no-fit", "--data",
                               str(DEFAULT_DATA.parent / "kernels_h100_measured.csv")])
    assert scored["rows_used"] == 307 and scored["rows_skipped"] == 0
    assert scored["families"]["gemm_bf16"]["median_abs_rel_err"] < 0.10
    assert scored["families"]["gemm_fp8"]["median_abs_rel_err"] < 0.10
    assert scored["families"]["hbm"]["median_abs_rel_err"] < 0.10
