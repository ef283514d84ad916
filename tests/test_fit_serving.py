"""``python -m validation.studies.serving.fit``: it recovers the host constants, request path and MoE constants rows
were made with, and refuses a file holding a test-set row."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simcore.serving import get_runtime
from validation.studies.serving import fit as fit_serving
from validation.studies.serving import simulate_case, split_of
from validation.studies.serving.mapping import map_row

_DATA = Path(__file__).resolve().parents[1] / "validation" / "data" / "serving_h200_measured.csv"


def _rows() -> tuple[dict, dict]:
    with _DATA.open(newline="") as f:
        rows = list(csv.DictReader(f))
    fit = next(r for r in rows if "Qwen3-235B" in r["model_path"] and r["backend"] == "sglang"
               and split_of(r) == "fit" and map_row(r).concurrency == 3)  # a small, quick row
    test = next(r for r in rows if split_of(r) == "test" and r["backend"] == "sglang" and not map_row(r).skip)
    return fit, test


def test_the_moe_fit_recovers_the_constants_a_row_was_made_with(tmp_path, monkeypatch, capsys):
    fit, test = _rows()
    case = map_row(fit)
    made_with = get_runtime("sglang").with_overrides(moe_memory_efficiency=0.7, moe_layer_s=50e-6, **case.launch)
    ttft, tpot, why = simulate_case(case, made_with)
    assert not why
    fit = dict(fit, silicon_ttft_ms=str(ttft * 1e3), silicon_tpot_ms=str(tpot * 1e3))
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fit))
        w.writeheader()
        w.writerows([fit])
    monkeypatch.setattr(fit_serving, "GRID_MOE_EFFICIENCY", (1.0, 0.7))
    monkeypatch.setattr(fit_serving, "GRID_MOE_LAYER_S", (0.0, 50e-6))
    seen = []

    def fit_only(case, runtime=None):
        seen.append(split_of(case.row))
        return simulate_case(case, runtime)

    monkeypatch.setattr(fit_serving, "simulate_case", fit_only)
    out = fit_serving.main(["--data", str(path), "--moe", "--runtimes", "sglang"])
    assert (out["sglang"]["moe_memory_efficiency"], out["sglang"]["moe_layer_s"]) == (0.7, 50e-6)
    assert out["sglang"]["median_abs_log_error"] < 1e-9 and out["sglang"]["rows"] == 1
    assert seen and set(seen) == {"fit"}


def test_a_file_holding_a_test_row_is_refused_in_one_line_before_any_simulation(tmp_path, monkeypatch, capsys):
    """The test set is a report, never a target: the fit does not drop a test row, it refuses the file."""
    from validation.studies.common.cli import run_script

    fit, test = _rows()
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fit))
        w.writeheader()
        w.writerows([fit, test])
    monkeypatch.setattr(fit_serving, "record_rows", lambda *a, **k: pytest.fail("simulated a row"))
    for mode in ([], ["--moe"]):
        with pytest.raises(SystemExit) as exc:
            run_script(lambda mode=mode: fit_serving.main(["--data", str(path), "--out", str(tmp_path / "j"), *mode]))
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and "1 test row(s)" in err and test["model_path"] in err and "\n" not in err


def test_the_host_fit_recovers_the_host_constants_and_request_path_rows_were_made_with(tmp_path):
    """Two small vLLM (synchronous) fit rows simulated with 4 ms + 20 us per sequence of host time per step,
    their TTFT 30 ms longer (a request path, as the fit reads one): the fit, which simulates each row once and
    re-times it, finds all three."""
    made_with = {"step_host_s": 4e-3, "step_host_per_seq_s": 20e-6, "request_s": 0.0, "tokenize_s_per_token": 0.0}
    rows = []
    for clients, osl in ((2, 16), (24, 24)):
        row = {**_BASE_FIT, "id": f"c{clients}", "osl": str(osl),
               "silicon_data_source": f"x; silicon_concurrency={clients}"}
        case = map_row(row)
        ttft, tpot, why = simulate_case(case, get_runtime(case.runtime).with_overrides(**made_with))
        assert not why and case.runtime == "vllm-sync"
        rows.append(dict(row, silicon_ttft_ms=str((ttft + 30e-3) * 1e3), silicon_tpot_ms=str(tpot * 1e3)))
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = fit_serving.main(["--data", str(path), "--runtimes", "vllm-sync", "--jobs", "1", "--out", str(tmp_path / "j")])
    found = out["vllm-sync"]
    assert (found["step_host_s"], found["step_host_per_seq_s"]) == (4e-3, 20e-6)
    assert found["median_abs_log_error"] < 1e-9 and found["rows"] == 2
    assert found["request_s"] == 30e-3 and found["ttft_median_abs_log_error"] < 1e-9
    assert found["ttft_client"] == "any"  # no row at InferenceX's lengths: every row


_BASE_FIT = {"source_url": "x", "backend": "vllm", "backend_version": "0.12.0", "model_path":
             "nvidia/Llama-3.1-8B-Instruct-FP8", "system": "h200_sxm", "precision": "fp8", "mode": "agg", "isl": "256",
             "osl": "16", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "tp_size": "1", "pp_size": "1",
             "attention_dp_size": "1", "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"}


def test_a_row_count_below_one_is_a_usage_error_naming_the_flag(capsys):
    import pytest

    for flag in ("--rows", "--ttft-rows"):
        with pytest.raises(SystemExit) as exc:
            fit_serving.main([flag, "0"])
        assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_the_moe_prefill_fit_recovers_the_kernel_rate_rows_were_made_with(tmp_path, monkeypatch):
    """Two fit rows (1,000- and 2,000-token prompts) simulated at a known grouped-GEMM efficiency: the fit
    picks it (each efficiency is scored at its own best request delay, here none)."""
    with _DATA.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if "Qwen3-235B" in r["model_path"] and r["backend"] == "sglang"
                and split_of(r) == "fit" and map_row(r).concurrency == 3]
    rows = [next(r for r in rows if r["isl"] == isl) for isl in ("1000", "2000")]
    made = []
    for row in rows:
        case = map_row(row)
        made_with = get_runtime("sglang").with_overrides(moe_gemm_efficiency=0.25, request_s=0.0, **case.launch)
        ttft, tpot, why = simulate_case(case, made_with)
        assert not why
        made.append(dict(row, silicon_ttft_ms=str(ttft * 1e3), silicon_tpot_ms=str(tpot * 1e3)))
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(made[0]))
        w.writeheader()
        w.writerows(made)
    monkeypatch.setattr(fit_serving, "GRID_MOE_GEMM_EFFICIENCY", (0.35, 0.25, 0.18))
    out = fit_serving.main(["--data", str(path), "--moe-prefill", "--runtimes", "sglang"])
    assert out["sglang"]["moe_gemm_efficiency"] == 0.25
    assert out["sglang"]["moe_ttft_median_abs_log_error"] < 1e-9 and out["sglang"]["moe_rows"] == 2
