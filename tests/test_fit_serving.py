"""``python -m validation.studies.serving.fit --moe``: it recovers the MoE constants a row was made with, and never
simulates a test-set row."""

from __future__ import annotations

import csv
from pathlib import Path

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
        w.writerows([fit, test])
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
    assert "1 fit rows used, 1 test rows refused" in capsys.readouterr().out
    assert seen and set(seen) == {"fit"}


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
