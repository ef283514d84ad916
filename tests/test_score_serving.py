"""validation.studies.serving.score: runtime values scored on serving rows as the study scores them."""

from __future__ import annotations

import csv
import json
import os
import signal

import numpy as np
import pytest
from conftest import write_rows

from validation.studies.serving import load_cases, simulate_case
from validation.studies.serving import score as score_serving

_DATA = score_serving._DATA


def _rows(tmp_path, n=2):
    rows = [r for r in csv.DictReader(_DATA.open()) if r["backend"] == "trtllm" and "Llama-3.1-70B" in r["model_path"]
            and r["isl"] == "1024" and r["osl"] == "1024" and r["tp_size"] == "8"][:n]
    return write_rows(tmp_path / "rows.csv", rows)


def test_the_shipped_group_is_the_studys_simulation_and_a_set_moves_it(tmp_path):
    path = _rows(tmp_path)
    result = score_serving.main(["--backend", "trtllm", "--data", str(path), "--jobs", "1", "--out", str(tmp_path / "journal"),
                                 "--set", "step_host_s=0.03"])
    shipped, slow = result["groups"]
    cases = [c for c in load_cases(path) if not c.skip]
    by_case = [(c.concurrency, simulate_case(c)[1] * 1e3 / float(c.row["silicon_tpot_ms"]) - 1) for c in cases]
    errs = sorted(e for _, e in by_case)
    assert shipped["set"] == {} and shipped["simulated"] == len(cases)
    assert shipped["median_signed_tpot_error"] == pytest.approx(sum(errs[:2]) / 2 if len(errs) == 2 else errs[0])
    for load, chosen in (("low", [e for c, e in by_case if c <= score_serving.LOW_LOAD_CLIENTS]),
                         ("high", [e for c, e in by_case if c > score_serving.LOW_LOAD_CLIENTS])):
        got = shipped[f"median_signed_tpot_error_{load}_load"]
        assert got == pytest.approx(float(np.median(chosen))) if chosen else got != got  # nan where none
    assert slow["set"] == {"step_host_s": 0.03}
    assert slow["median_signed_tpot_error"] > shipped["median_signed_tpot_error"] + 0.5  # a 30 ms host floor


@pytest.mark.parametrize("args, named", [
    (["--set", "bogus=1"], "--set 'bogus=1'"),
    (["--set", "moe_layer_s=abc"], "--set moe_layer_s"),
    (["--set", "spec_accept=0.8"], "--set spec_accept"),
    (["--set", "moe_layer_s=-1"], "moe_layer_s must be >= 0"),
    (["--model", "no-such-model"], "--backend/--model/--mode"),
    (["--data", "/no/such.csv"], "--data"),
    (["--out", "A_FILE"], "--out"),  # a file where the journal's folder goes: had been a traceback
    (["--split", "test", "--set", "moe_layer_s=1e-5"], "--set with --split test"),  # the test split is no target
])
def test_bad_input_is_one_named_line_and_exit_2(tmp_path, capsys, args, named):
    argv = ["--backend", "trtllm", "--jobs", "1", "--out", str(tmp_path / "journal")] + (["--data", str(_rows(tmp_path, 1))] if "--data" not in args else [])
    (tmp_path / "a_file").write_text("")
    args = [str(tmp_path / "a_file") if a == "A_FILE" else a for a in args]
    with pytest.raises(SystemExit) as exc:
        score_serving.main(argv + args)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and named in err and "\n" not in err


def test_mode_filter_rows_print_and_strict_json(tmp_path, capsys):
    """``--mode`` keeps the rows of that mode only (none here: the Llama-70B rows are aggregated, a
    one-line error); ``--rows`` prints each row's measured and simulated values; a median over no
    rows (the one row runs at 8 clients, so none above) is null in the JSON line, never NaN."""
    path = _rows(tmp_path, 1)
    with pytest.raises(SystemExit) as exc:
        score_serving.main(["--backend", "trtllm", "--data", str(path), "--jobs", "1", "--out", str(tmp_path / "journal"), "--mode", "disagg"])
    assert exc.value.code == 2 and "--mode" in capsys.readouterr().err
    result = score_serving.main(["--backend", "trtllm", "--data", str(path), "--jobs", "1", "--out", str(tmp_path / "journal"), "--mode", "agg",
                                 "--rows"])
    out = capsys.readouterr().out.splitlines()
    cases = [c for c in load_cases(path) if not c.skip]
    printed = [line for line in out if line.strip().startswith("agg ")]
    assert len(printed) == len(cases) == result["rows"]
    for line, case in zip(printed, cases, strict=True):
        ttft, tpot, _ = simulate_case(case)
        assert f"{float(case.row['silicon_tpot_ms']):7.2f}/{tpot * 1e3:7.2f}" in line
        assert f"{float(case.row['silicon_ttft_ms']):8.1f}/{ttft * 1e3:8.1f}" in line
    line = json.loads(out[-1])  # strict JSON: json.loads accepts NaN, so look for it in the text too
    assert "NaN" not in out[-1] and line["mode"] == "agg"
    group = line["groups"][0]
    empty = [k for k, v in result["groups"][0].items() if isinstance(v, float) and v != v]
    assert empty == ["median_signed_tpot_error_high_load"] and group[empty[0]] is None


def test_layout_names_each_pool_of_a_disaggregated_row():
    row = {"mode": "disagg", "prefill_num_workers": "2", "prefill_tp_size": "8", "prefill_moe_ep_size": "8",
           "decode_num_workers": "3", "decode_tp_size": "1", "decode_attention_dp_size": "8",
           "decode_moe_ep_size": "8"}
    assert score_serving._layout(row) == "P 2x(tp8 adp- mtp- mep8) + D 3x(tp1 adp8 mtp- mep8)"
    assert score_serving._layout({"mode": "agg", "tp_size": "4", "moe_tp_size": "4"}) == "tp4 adp- mtp4 mep-"


def test_an_interrupted_score_keeps_its_rows_and_ends_as_a_fresh_one(tmp_path, monkeypatch, capsys):
    """SIGINT after the first row: exit 130 with one line saying where the rows are; the same command
    again simulates only the second row and prints the figures of an uninterrupted run."""
    path = _rows(tmp_path)
    argv = ["--backend", "trtllm", "--data", str(path), "--jobs", "1"]
    fresh = score_serving.main(argv + ["--out", str(tmp_path / "fresh")])
    one, calls = score_serving._one, []

    def stop_after_first(args):
        calls.append(args[0].concurrency)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # caught by the journal's StopRequest: stop after this row
        return one(args)

    monkeypatch.setattr(score_serving, "_one", stop_after_first)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        score_serving.main(argv + ["--out", str(tmp_path / "cut")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 128 + signal.SIGINT and err.startswith("interrupted: 1 of 2 rows") and "\n" not in err
    resumed = score_serving.main(argv + ["--out", str(tmp_path / "cut")])
    assert resumed == fresh and len(calls) == 2  # the first row read back, the second simulated once


def test_each_group_and_each_data_file_has_its_own_journal(tmp_path, monkeypatch):
    """A ``--set`` group never reads the shipped group's answers, nor one data file another's."""
    path = _rows(tmp_path, 1)
    out = tmp_path / "journal"
    score_serving.main(["--backend", "trtllm", "--data", str(path), "--jobs", "1", "--out", str(out)])
    shipped = sorted(p.name for p in out.iterdir())
    monkeypatch.setattr(score_serving, "_one", lambda args: (1.0, 1.0, ""))  # any new simulation is seen
    again = score_serving.main(["--backend", "trtllm", "--data", str(path), "--jobs", "1", "--out", str(out),
                                "--set", "step_host_s=0.03"])
    assert again["groups"][0]["median_signed_tpot_error"] < 1  # read back: the real simulation
    assert again["groups"][1]["median_signed_tpot_error"] > 10  # simulated: 1 s a token
    assert len(list(out.iterdir())) == 2 and set(shipped) < {p.name for p in out.iterdir()}
    other = tmp_path / "other.csv"
    other.write_text(path.read_text() + "\n")  # the same row, other bytes: another fingerprint
    third = score_serving.main(["--backend", "trtllm", "--data", str(other), "--jobs", "1", "--out", str(out)])
    assert third["groups"][0]["median_signed_tpot_error"] > 10 and len(list(out.iterdir())) == 3


def test_explain_refuses_a_candidate_on_the_test_split(capsys):
    """``explain --split test --set ...``: one line, exit 2, before any row is simulated (the test split is a
    report, never a target)."""
    from validation.studies.common.cli import run_script
    from validation.studies.serving import explain

    with pytest.raises(SystemExit) as exc:
        run_script(lambda: explain.main(["--split", "test", "--set", "step_host_s=1e-3"]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--set with --split test" in err and "\n" not in err
