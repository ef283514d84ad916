"""The inference study: predicts rows of any CSV in the schema, skips what it cannot express."""

import csv
import json
from pathlib import Path

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


def test_error_figures_on_a_hand_made_csv_are_per_split(tmp_path):
    """The study's figures are the errors of its rows, labelled by split: two copies of one row whose
    measured values differ by a known factor give a known error, each in its own set."""
    first = tmp_path / "a"
    run_one = run(_write_rows(tmp_path / "one.csv", [GOOD | {"split": "fit"}]), first)
    predicted = float(run_one["by_split"]["fit"]["simulator"]["median_rel_error"] + 1.0) * float(GOOD["value"])
    rows = [GOOD | {"split": "fit", "value": f"{predicted / 1.25:.6g}"},
            GOOD | {"split": "test", "value": f"{predicted / 0.8:.6g}"}]
    summary = run(_write_rows(tmp_path / "two.csv", rows), tmp_path / "b")
    assert summary["splits"] == ["fit", "test"]
    assert summary["by_split"]["fit"]["simulator"]["median_rel_error"] == pytest.approx(0.25, abs=1e-4)
    assert summary["by_split"]["test"]["simulator"]["median_rel_error"] == pytest.approx(-0.2, abs=1e-4)
    assert summary["by_split"]["test"]["label"] == "test (out of sample), 1 rows"
    assert summary["by_split"]["test"]["simulator_static_long_output"] == {"rows": 0}
    report = (tmp_path / "b" / "report.md").read_text()
    assert "| test | simulator | 1 |" in report and "| fit | simulator | 1 |" in report


def test_a_bad_split_value_skips_the_row(tmp_path):
    summary = run(_write_rows(tmp_path / "in.csv", [GOOD | {"split": "train"}, GOOD]), tmp_path / "out")
    assert summary["rows_used"] == 1 and "train" in summary["skipped"][0]["reason"]


def _rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _write_rows(path, rows):
    _write(path, rows)
    return path


def test_masked_mha_generation_reads_the_kv_cache_once_per_query_head():
    """TensorRT-LLM before XQA re-reads each KV head per query head: a GQA model's decode attention
    moves group x the bytes at re-read 1; an MHA model (group 1) and today's runtimes do not change."""
    from simcore.cost.proxy import evaluate
    from validation.studies.inference import decode_kv_reread

    falcon = GOOD | {"model": "falcon-180b", "gpus": "8", "tp": "8", "batch": "1024", "source_url":
                     "https://github.com/NVIDIA/TensorRT-LLM/blob/release/0.5.0/docs/source/performance.md"}
    case = parse_row(falcon)
    assert decode_kv_reread(falcon, case.ctx.model, 1.0) == 1.0
    assert decode_kv_reread(falcon | {"source_url": "vllm"}, case.ctx.model, 1.0) == 0.0
    assert decode_kv_reread(GOOD | {"source_url": falcon["source_url"]}, parse_row(GOOD).ctx.model, 1.0) == 0.0
    llama70 = {"model": "llama-2-70b", "gpus": "2", "tp": "2",
               "source_url": "https://github.com/NVIDIA/TensorRT-LLM/blob/v0.8.0/docs/source/performance.md"}
    model70 = parse_row(GOOD | llama70).ctx.model
    assert decode_kv_reread(GOOD | llama70, model70, 1.0) == 1.0  # XQA off by default in 0.8
    assert decode_kv_reread(GOOD | llama70 | {"note": "TRTLLM_ENABLE_XQA=1"}, model70, 1.0) == 0.0

    def attention_s(reread):
        import dataclasses

        # long decode context: KV bytes dominate the kernel's fixed cost and its query/output bytes
        workload = dataclasses.replace(case.ctx.workload, phase="decode", input_len=16384, decode_kv_reread=reread)
        ctx = dataclasses.replace(case.ctx, workload=workload)
        return evaluate(ctx, case.strategy).by_operator["attention"]

    group = case.ctx.model.num_heads / case.ctx.model.num_kv_heads  # tp 8 = kv heads: 29 per GPU
    assert attention_s(1.0) / attention_s(0.0) == pytest.approx(group, rel=0.05)
    assert attention_s(0.5) == pytest.approx((attention_s(0.0) + attention_s(1.0)) / 2, rel=0.02)


def test_fit_scripts_refuse_test_rows(tmp_path, capsys):
    from validation.studies.inference import fit as fit_inference
    from validation.studies.kernels import fit as fit_kernels

    shipped = Path(__file__).resolve().parent.parent / "validation" / "data"
    for main, name in ((fit_inference.main, "inference_test.csv"), (fit_kernels.main, "kernels_h100_test.csv")):
        with pytest.raises(SystemExit, match="test row") as info:
            main(["--data", str(shipped / name)])
        assert "\n" not in str(info.value)
    # a test row copied into a file without the split column is still a test row (its source is)
    rows = _rows(shipped / "inference_test.csv")[:1]
    _write(tmp_path / "copied.csv", [{k: v for k, v in rows[0].items() if k != "split"}])
    with pytest.raises(SystemExit, match="test row"):
        fit_inference.main(["--data", str(tmp_path / "copied.csv")])
    capsys.readouterr()


def test_shipped_splits_share_no_source_and_hold_no_duplicates():
    shipped = Path(__file__).resolve().parent.parent / "validation" / "data"
    for prefix in ("inference", "kernels"):
        sources: dict[str, set[str]] = {"fit": set(), "test": set()}
        seen = set()
        for path in sorted(shipped.glob(f"{prefix}*.csv")):
            for row in _rows(path):
                assert row["split"] in sources, (path.name, row["split"])
                sources[row["split"]].add(row["source_url"])
                key = tuple(v for k, v in row.items() if k not in ("note", "split"))
                assert key not in seen, (path.name, key[:4])
                seen.add(key)
        assert sources["fit"] and sources["test"] and not sources["fit"] & sources["test"]


@pytest.mark.parametrize("bad", [{"gpus": "0"}, {"gpus": "3", "tp": "2"}, {"value": "-1"}])
def test_bad_rows_raise_one_line(bad):
    with pytest.raises(ValueError) as info:
        parse_row(GOOD | bad)
    assert "\n" not in str(info.value)
