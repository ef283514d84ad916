"""Leave-one-group-out cross-validation of the serving fit (``validation/studies/serving/cross_validate.py``) and
the re-timing it rests on (``host_replay.py``): a recorded run re-timed under other host constants is the
simulation with them, to rounding."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from simcore.serving import get_runtime
from validation.studies.serving import cross_validate as cv
from validation.studies.serving import host_replay, simulate_case
from validation.studies.serving.host_replay import NotReplayable, Recording, record, retime
from validation.studies.serving.mapping import map_row

_BASE = {"source_url": "x", "backend": "vllm", "backend_version": "0.12.0", "system": "h200_sxm", "precision": "fp8",
         "mode": "agg", "isl": "512", "osl": "32", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "pp_size": "1",
         "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"}


def _row(clients: int, **kw) -> dict:
    return {**_BASE, "id": f"{kw.get('model_path', 'm')}-{clients}", "silicon_data_source": f"x; silicon_concurrency={clients}",
            **{k: str(v) for k, v in kw.items()}}


_SYNC = _row(8, model_path="nvidia/Llama-3.1-8B-Instruct-FP8", tp_size=1)  # vLLM before v0.14: host before GPU
_OVERLAP = _row(12, model_path="meta-llama/Llama-3.1-8B-Instruct", backend="sglang", tp_size=1)  # prefill steps alone
# TensorRT-LLM, MoE with two attention-DP groups: the host waits for the busiest group's sequences
_ATTENTION_DP = _row(16, model_path="Qwen/Qwen3-235B-A22B-FP8", backend="trtllm", tp_size=2, attention_dp_size=2,
                     moe_tp_size=1, moe_ep_size=4, osl=24)


@pytest.mark.parametrize("row", [_SYNC, _OVERLAP, _ATTENTION_DP], ids=["vllm-sync", "sglang", "trtllm-attention-dp"])
def test_a_recorded_run_retimed_is_the_simulation_with_those_host_constants(row):
    """The shortcut the fit and its cross-validation take (host_replay's module doc), against the simulator
    itself: for host constants from none to past the fit's grids, mean TTFT and TPOT agree to 1e-9."""
    case = map_row(row)
    assert not case.skip, case.skip
    rec = record(case)
    for step_s, per_seq_s in ((0.0, 0.0), (3e-3, 10e-6), (12e-3, 120e-6), (0.4e-3, 250e-6)):
        runtime = get_runtime(case.runtime).with_overrides(step_host_s=step_s, step_host_per_seq_s=per_seq_s,
                                                           request_s=0.0, tokenize_s_per_token=0.0)
        ttft, tpot, why = simulate_case(case, runtime)
        assert not why
        assert retime(rec, step_s, per_seq_s) == pytest.approx((ttft, tpot), rel=1e-9)


def test_the_host_moves_an_overlapped_step_only_where_it_outlasts_the_gpu():
    """Three steps of 1 s of GPU time, one request over all three (a hand-computed timeline)."""
    rec = Recording(gpu_s=np.ones(3), seqs=np.ones(3), sent=np.array([-1]), first=np.array([0]),
                    finish=np.array([2]), tokens=np.array([3.0]), prompt=np.array([8.0]), overlap=True)
    assert retime(rec, 0.5, 0.0) == pytest.approx((1.0, 1.0))  # hidden under the previous step's GPU time
    assert retime(rec, 2.0, 0.0) == pytest.approx((1.0, 2.0))  # steps start 2 s apart: ends at 1, 3, 5
    sync = Recording(**{**rec.__dict__, "overlap": False})
    assert retime(sync, 0.5, 0.0) == pytest.approx((1.5, 1.5))  # before each step: ends at 1.5, 3, 4.5


def test_rows_whose_steps_could_move_with_the_host_are_not_replayed(tmp_path):
    disagg = _row(8, model_path="nvidia/Llama-3.1-8B-Instruct-FP8", mode="disagg", prefill_num_workers=1,
                  decode_num_workers=1, **{f"{p}_{k}": 1 for p in ("prefill", "decode")
                                           for k in ("tp_size", "pp_size", "batch_size")})
    with pytest.raises(NotReplayable, match="disagg"):
        record(map_row(disagg))
    pipeline = dict(_SYNC, pp_size="2", tp_size="1")
    with pytest.raises(NotReplayable, match="pipeline stages"):
        record(map_row(pipeline))
    rec = record(map_row(_SYNC))
    rec.save(tmp_path / "r.npz")
    back = Recording.load(tmp_path / "r.npz")  # numbers only, read back without pickle
    assert retime(back, 2e-3, 5e-6) == retime(rec, 2e-3, 5e-6)


def _made(rows: list[dict], made_with: dict) -> list[dict]:
    """The rows with their measured TTFT and TPOT as simulated under ``made_with`` (no request path) and TTFT
    30 ms longer (one, as the fit reads it)."""
    out = []
    for row in rows:
        case = map_row(row)
        ttft, tpot, why = simulate_case(case, get_runtime(case.runtime).with_overrides(request_s=0.0,
                                                                                   tokenize_s_per_token=0.0, **made_with))
        assert not why
        out.append(dict(row, silicon_ttft_ms=str((ttft + 30e-3) * 1e3), silicon_tpot_ms=str(tpot * 1e3)))
    return out


def _tiny(tmp_path: Path) -> Path:
    """Two vLLM (synchronous) groups made with one set of host constants, an SGLang group alone, and a
    test-model row."""
    rows = _made([_row(2, model_path="nvidia/Llama-3.1-8B-Instruct-FP8", tp_size=1),
                  _row(16, model_path="nvidia/Llama-3.1-8B-Instruct-FP8", tp_size=1),
                  _row(4, model_path="meta-llama/Llama-3.1-70B", tp_size=4, osl=16),
                  _row(24, model_path="meta-llama/Llama-3.1-70B", tp_size=4, osl=16),
                  dict(_OVERLAP), _row(4, model_path="Qwen/Qwen3-32B", precision="", gemm_quant_mode="",
                                       moe_quant_mode="", tp_size=1)], _MADE_WITH)
    data = tmp_path / "rows.csv"
    with data.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return data


_MADE_WITH = {"step_host_s": 4e-3, "step_host_per_seq_s": 20e-6}


def test_each_group_is_predicted_by_a_fit_without_it_and_the_run_is_read_back(tmp_path, monkeypatch, capsys):
    """The two vLLM groups, made with the same host constants, refit them without each other: re-timed as the
    fit reads rows, each predicts the other exactly; simulated with the 30 ms request path, less so. The
    SGLang group alone has no other group of its runtime, so is not predicted; the test-model row never
    enters. The same call again simulates nothing: recordings and predictions are read back."""
    data = _tiny(tmp_path)
    summary = cv.cross_validate(data, tmp_path / "run", jobs=1)
    groups = summary["groups"]
    assert set(groups) == {"llama-3.1-8b vllm-sync", "llama-3.1-70b vllm-sync", "llama-3.1-8b sglang"}  # no Qwen3-32B
    for name in ("llama-3.1-8b vllm-sync", "llama-3.1-70b vllm-sync"):
        g = groups[name]
        assert g["refit"] | _MADE_WITH == g["refit"] and g["refit"]["request_s"] == 30e-3 and g["rows"] == 2
        assert g["retimed_tpot"] < 1e-9 and g["retimed_ttft"] < 1e-9  # exactly what the rows were made with
        # simulated with the request path: a request that reaches the scheduler mid-step waits for the step's end,
        # which these 16-token requests at few clients feel (what the re-timed reading leaves out)
        assert 0 < g["tpot"] < 1 and 0 < g["ttft"] < 1
    assert groups["llama-3.1-8b sglang"]["tpot"] is None and groups["llama-3.1-8b sglang"]["refit"] is None
    assert summary["groups_predicted"] == 2 and summary["logo_tpot_median"] == pytest.approx(
        float(np.median([groups[n]["tpot"] for n in ("llama-3.1-8b vllm-sync", "llama-3.1-70b vllm-sync")])))
    assert summary["logo_worst_group"]["name"] in groups and set(summary["logo_worst_group"]) == {"name", "tpot", "ttft"}
    written = json.loads((tmp_path / "run" / "cross_validation.json").read_text())
    assert written["logo_ttft_median"] == summary["logo_ttft_median"]
    capsys.readouterr()
    monkeypatch.setattr(host_replay, "_record_row", lambda args: pytest.fail("recorded again"))
    monkeypatch.setattr(cv, "_simulate_with", lambda args: pytest.fail("simulated again"))
    again = cv.cross_validate(data, tmp_path / "run", jobs=1)
    out = capsys.readouterr().out
    assert again["groups"] == groups and "5 row(s) read back" in out and "4 row(s) read back" in out


def test_a_prediction_at_the_shipped_values_is_the_studys_own_simulation(tmp_path, monkeypatch, capsys):
    """Where a fold's refitted values are the shipped ones, its prediction is journaled under the study's key:
    the plain study in the same run dir reads it back rather than simulating it again."""
    from types import SimpleNamespace

    from validation.studies import serving
    from validation.studies.serving.host_replay import HOST_FIELDS

    def shipped(rows):
        runtime = get_runtime(rows[0][0].runtime)
        return {f: getattr(runtime, f) for f in HOST_FIELDS} | {"ttft_client": "harness"}

    monkeypatch.setattr(cv, "fit_host", shipped)
    data = _tiny(tmp_path)
    cv.cross_validate(data, tmp_path / "run", jobs=1)
    capsys.readouterr()
    serving.run(data, tmp_path / "run", SimpleNamespace(jobs=1))
    assert "journal: 4 row(s) read back" in capsys.readouterr().out  # 6 measurements: 2 simulated here


def test_the_app_reads_cross_validate_for_the_serving_study_only():
    from planner.apps.common import UserError
    from validation.apps.validate import READS, _check_read

    assert "cross_validate" in READS["serving"] and all("cross_validate" not in v for k, v in READS.items()
                                                        if k != "serving")
    _check_read("serving", OmegaConf.create({"name": "serving", "cross_validate": True}))
    with pytest.raises(UserError, match="study.cross_validate: study kernels does not read it"):
        _check_read("kernels", OmegaConf.create({"name": "kernels", "cross_validate": True}))


def test_the_app_hands_study_cross_validate_to_the_cross_validation(tmp_path, monkeypatch):
    """``study.cross_validate=true`` runs the cross-validation instead of the study (the app dispatches it: the
    cross-validation builds on the study's package)."""
    from types import SimpleNamespace

    from validation.apps import validate

    seen = {}
    monkeypatch.setattr(validate, "cross_validate", lambda data, out, jobs: seen.update(data=data, jobs=jobs) or {"ok": 1})
    monkeypatch.setattr(validate.serving, "run", lambda *a: pytest.fail("ran the study"))
    assert validate._serving(Path("d.csv"), tmp_path, SimpleNamespace(jobs=3, cross_validate=True)) == {"ok": 1}
    assert seen == {"data": Path("d.csv"), "jobs": 3}
