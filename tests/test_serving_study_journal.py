"""The serving study's journal: rows read back equal rows simulated afresh, under the same code and data only,
and an interrupted study keeps what it had simulated."""

import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import write_rows

import validation.studies.serving as study
from validation.studies.serving import run
from validation.studies.serving.journal import RowJournal, StudyInterrupted, fingerprint, simulate_rows

_BASE = {"source_url": "x", "backend": "vllm", "backend_version": "0.12.0", "system": "h200_sxm",
         "precision": "fp8", "mode": "agg", "isl": "256", "osl": "16", "gemm_quant_mode": "fp8",
         "moe_quant_mode": "fp8", "batch_size": "8", "tp_size": "1", "pp_size": "1", "attention_dp_size": "1",
         "model_path": "meta-llama/Llama-3.1-8B-Instruct", "silicon_ttft_ms": "100", "silicon_tpot_ms": "10"}


def _data(path: Path, clients=(2, 4, 6)) -> Path:
    return write_rows(path, [dict(_BASE, id=f"c{c}", silicon_data_source=f"silicon_concurrency={c}")
                             for c in clients])


def test_fingerprint_follows_the_data(tmp_path):
    a, b = _data(tmp_path / "a.csv"), _data(tmp_path / "b.csv", clients=(2, 4))
    assert fingerprint(a) == fingerprint(a) and fingerprint(a) != fingerprint(b)


def test_fingerprint_covers_the_shipped_model_configs():
    from validation.studies.serving.journal import _sources

    names = {name for name, _ in _sources()}
    assert "simcore/serving/step_cost.py" in names and "validation/studies/common/split.py" in names
    assert any(n.startswith("simcore/models/configs/") and n.endswith(".json") for n in names)
    assert not any("__pycache__" in n for n in names)


def test_journal_reads_back_its_rows_and_skips_a_line_cut_short(tmp_path):
    with RowJournal(tmp_path, "stamp") as j:
        j.append("k1", (0.1, 0.01, ""))
        j.append("k2", (float("nan"), float("nan"), "no preset"))
    with (tmp_path / RowJournal.NAME).open("a") as f:
        f.write('{"key": "k3", "ttft_')  # a kill mid-line
    again = RowJournal(tmp_path, "stamp")
    again.close()
    assert again.reused == 2 and again.results["k1"] == (0.1, 0.01, "")
    assert again.results["k2"][2] == "no preset" and "k3" not in again.results


def test_a_journal_of_other_code_or_data_is_set_aside(tmp_path):
    with RowJournal(tmp_path, "old") as j:
        j.append("k1", (0.1, 0.01, ""))
    fresh = RowJournal(tmp_path, "new")
    fresh.close()
    assert fresh.reused == 0 and not fresh.results
    assert (tmp_path / (RowJournal.NAME + ".stale")).exists()
    assert json.loads((tmp_path / RowJournal.NAME).read_text().splitlines()[0]) == {"fingerprint": "new"}


def test_a_rerun_reads_every_row_back_and_writes_the_same_files(tmp_path, monkeypatch):
    data = _data(tmp_path / "in.csv")
    fresh = run(data, tmp_path / "out", SimpleNamespace(jobs=1))
    first = (tmp_path / "out" / "rows.csv").read_text()

    def no_simulation(row):
        raise AssertionError("a row the journal holds was simulated again")

    monkeypatch.setattr(study, "_simulate_row", no_simulation)
    again = run(data, tmp_path / "out", SimpleNamespace(jobs=1))
    assert (tmp_path / "out" / "rows.csv").read_text() == first and again == fresh


def test_an_interrupted_study_keeps_its_rows_and_finishes_as_a_fresh_one(tmp_path, monkeypatch):
    data = _data(tmp_path / "in.csv")
    run(data, tmp_path / "fresh", SimpleNamespace(jobs=1))
    simulate = study._simulate_row
    calls = []

    def stop_after_first(row):
        calls.append(row["id"])
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # caught by the study's StopRequest: stop after this row
        return simulate(row)

    monkeypatch.setattr(study, "_simulate_row", stop_after_first)
    with pytest.raises(StudyInterrupted) as info:
        run(data, tmp_path / "cut", SimpleNamespace(jobs=1))
    assert (info.value.done, info.value.total, info.value.signal) == (1, 3, signal.SIGINT)
    assert not (tmp_path / "cut" / "rows.csv").exists()  # nothing half-written: only the journal
    monkeypatch.setattr(study, "_simulate_row", simulate)
    run(data, tmp_path / "cut", SimpleNamespace(jobs=2))
    assert calls == ["c2"]  # the first row was read back, not simulated again
    assert (tmp_path / "cut" / "rows.csv").read_text() == (tmp_path / "fresh" / "rows.csv").read_text()



def _answer(row: dict) -> tuple[float, float, str]:
    """A stand-in simulation for the worker processes (module level: pickled by reference); row ``stop``
    sends SIGINT to the study's process, as Ctrl-C does, unless ``row["quiet"]``."""
    if row["id"] == "stop" and not row.get("quiet"):
        os.kill(os.getppid(), signal.SIGINT)
    time.sleep(0.1)
    return float(row["n"]), 2.0 * float(row["n"]), ""


def test_worker_processes_stop_between_rows_and_keep_the_rows_in_flight(tmp_path):
    rows = [{"id": "stop" if n == 1 else f"r{n}", "n": n} for n in range(40)]
    keys = [r["id"] for r in rows]
    with pytest.raises(StudyInterrupted) as info:
        simulate_rows(rows, keys, _answer, 2, tmp_path, "stamp")
    assert 2 <= info.value.done < len(rows)  # the signalling row and the one beside it at least; not all
    kept = RowJournal(tmp_path, "stamp")
    kept.close()
    assert "stop" in kept.results and len(kept.results) == info.value.done
    quiet = [dict(r, quiet=True) for r in rows]  # the rerun: the rows kept are read back, the rest simulated
    assert simulate_rows(quiet, keys, _answer, 2, tmp_path, "stamp") == [(float(n), 2.0 * n, "") for n in range(40)]


def test_a_stop_during_the_last_row_loses_nothing_and_is_no_interrupt(tmp_path):
    """Ctrl-C while the last row runs: that row ends and is kept, so every answer is there and the
    study (or score) ends as an uninterrupted one instead of asking for a rerun."""
    rows = [{"id": f"r{n}", "n": n} for n in range(3)] + [{"id": "stop", "n": 3}]

    def answer_in_process(row):  # one job: simulated here, so the signal comes to this process
        if row["id"] == "stop":
            os.kill(os.getpid(), signal.SIGINT)
        return float(row["n"]), 2.0 * float(row["n"]), ""

    got = simulate_rows(rows, [r["id"] for r in rows], answer_in_process, 1, tmp_path, "stamp")
    assert got == [(float(n), 2.0 * n, "") for n in range(4)]
