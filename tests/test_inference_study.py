"""The inference study: predicts rows of any CSV in the schema, skips what it cannot express."""

import csv
import json

import pytest

from validation.studies.inference import COLUMNS, parse_row, run

GOOD = {"source_url": "x", "model": "llama-2-7b", "hardware": "h100-sxm", "gpus": "1", "tp": "1", "pp": "1",
        "ep": "1", "dp": "1", "precision": "fp8", "scenario": "static", "batch": "64", "input_len": "128",
        "output_len": "128", "metric": "output_tokens_per_s", "value": "9193", "unit": "tokens/s", "note": ""}


def _write(path, rows, extra_column=None):
    cols = list(COLUMNS) + ([extra_column] if extra_column else [])
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols)
        writer.writeheader()
        for r in rows:
            writer.writerow({c: r.get(c, "") for c in cols})


def test_study_predicts_good_rows_and_skips_bad_ones(tmp_path):
    data = tmp_path / "in.csv"
    rows = [GOOD, GOOD | {"model": "gpt-99"}, GOOD | {"batch": "x"}, GOOD | {"metric": "joules"},
            GOOD | {"scenario": "prefill", "metric": "ttft_ms", "value": "36", "input_len": "2048", "batch": "1"}]
    _write(data, rows, extra_column="mystery")
    summary = run(data, tmp_path / "out")
    assert summary["rows_used"] == 2 and summary["rows_skipped"] == 3
    assert summary["unknown_columns"] == ["mystery"]
    reasons = " ".join(s["reason"] for s in summary["skipped"])
    assert "gpt-99" in reasons and "joules" in reasons
    with open(tmp_path / "out" / "rows.csv") as fh:
        out = list(csv.DictReader(fh))
    assert {"sim_value", "proxy_value", "rel_error", "skipped_reason"} <= set(out[0])
    assert float(out[0]["sim_value"]) > 0
    for name in ("summary.json", "report.md", "scatter.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["simulator"]["rows"] == 2


def test_decode_batch_is_per_device():
    row = GOOD | {"model": "deepseek-v3", "gpus": "32", "ep": "32", "dp": "32", "scenario": "decode",
                  "batch": "256", "input_len": "2000", "output_len": "", "metric": "output_tokens_per_s_per_node"}
    case = parse_row(row)
    assert (case.strategy.tp, case.strategy.ep, case.strategy.dp, case.strategy.batch) == (1, 32, 1, 256 * 32)


def test_shipped_calibration_median_error_is_within_target():
    """The headline figure: simulator median |error| on the calibration data (target <= 15%)."""
    import tempfile
    from pathlib import Path

    data = Path(__file__).resolve().parent.parent / "validation" / "data" / "inference_calibration.csv"
    with tempfile.TemporaryDirectory() as out:
        summary = run(data, out)
    assert summary["simulator"]["median_abs_rel_error"] <= 0.15


@pytest.mark.parametrize("bad", [{"gpus": "0"}, {"gpus": "3", "tp": "2"}, {"value": "-1"}])
def test_bad_rows_raise_one_line(bad):
    with pytest.raises(ValueError) as info:
        parse_row(GOOD | bad)
    assert "\n" not in str(info.value)
