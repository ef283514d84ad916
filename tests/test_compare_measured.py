"""validation.studies.inference.compare_measured: our own H100 forward-pass timings against the model without a runtime."""

import json

import pytest

from validation.studies.inference import compare_measured


def test_shipped_measurements_are_scored_and_end_with_json(capsys):
    summary = compare_measured.main(["--no-sim"])
    assert summary["rows"] == 27 and summary["skipped"] == 0
    assert set(summary["median_abs_err_by_phase"]) == {"decode", "prefill"}
    assert list(summary["by_split"]) == ["test (out of sample), 27 rows"]
    assert 0 < summary["median_abs_err"]["proxy"] < 0.5
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary


def test_runtime_overhead_adds_to_every_decode_step(tmp_path, capsys):
    rows = (compare_measured.DEFAULT_DATA.read_text().splitlines())
    (tmp_path / "one.csv").write_text("\n".join(rows[:2]) + "\n")
    base = compare_measured.main(["--no-sim", "--data", str(tmp_path / "one.csv")])
    later = compare_measured.main(["--no-sim", "--data", str(tmp_path / "one.csv"), "--runtime-overhead-s", "0.001"])
    measured_ms = float(rows[1].split(",")[14])
    pred_ms = measured_ms * (1 - base["median_abs_err"]["proxy"])  # the model is faster than this row
    assert later["median_abs_err"]["proxy"] == pytest.approx(abs((pred_ms + 1.0) / measured_ms - 1), abs=2e-4)
    with pytest.raises(SystemExit, match="runtime-overhead"):
        compare_measured.main(["--runtime-overhead-s", "-1"])
    capsys.readouterr()
