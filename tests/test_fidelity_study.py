"""The fidelity study (simulator vs proxy): outputs, rank figures, regimes, re-ranking, explanations."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_ctx
from validation.studies.fidelity.explain import deltas, dominant_cause, explain, overlap_contention_why
from validation.studies.fidelity.regimes import REGIMES, classify, collective_profile, primary
from validation.studies.fidelity.stats import rank_agreement, ratio_stats, rerank, top_overlap

ROOT = Path(__file__).resolve().parent.parent
VALIDATE = "from validation.apps.validate import main; main()"
OUTPUTS = ("summary.json", "report.md", "scatter.png", "ratios.png", "strategies.csv")


def _validate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", VALIDATE, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """``shard-validate study=fidelity study.quick=true``: one scenario, a dozen strategies."""
    out = tmp_path_factory.mktemp("fidelity")
    proc = _validate("study=fidelity", "study.quick=true", f"hydra.run.dir={out}", cwd=out)
    assert proc.returncode == 0, proc.stderr
    with open(out / "strategies.csv") as fh:
        rows = list(csv.DictReader(fh))
    return out, json.loads((out / "summary.json").read_text()), rows, proc


def test_quick_run_writes_every_output(quick_run):
    out, summary, rows, proc = quick_run
    for name in OUTPUTS:
        assert (out / name).stat().st_size > 0, name
    assert len(rows) == 12 and len({r["key"] for r in rows}) == 12
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["study"] == "fidelity" and last["headline"]["dense-70b-1node"]["strategies"] == 12
    assert "dense-70b-1node" in (out / "report.md").read_text()


def test_rank_figures_are_correlations(quick_run):
    _, summary, rows, _ = quick_run
    s = summary["scenarios"]["dense-70b-1node"]
    assert -1.0 <= s["kendall_tau"] <= 1.0 and -1.0 <= s["spearman"] <= 1.0
    assert 0 <= s["top10"]["overlap"] <= 10
    assert all(float(r["sim_tokens_per_s_per_gpu"]) > 0 and float(r["ratio"]) > 0 for r in rows)


def test_every_strategy_has_a_regime(quick_run):
    _, summary, rows, _ = quick_run
    for r in rows:
        flags = r["regimes"].split("|")
        assert flags and set(flags) <= set(REGIMES) and r["regime"] == primary(flags)
    assert set(summary["regimes"]) <= set(REGIMES)
    assert sum(summary["scenarios"]["dense-70b-1node"]["primary_regimes"].values()) == 12


def test_reranking_record_is_present(quick_run):
    _, summary, _, _ = quick_run
    rec = summary["scenarios"]["dense-70b-1node"]["rerank"]["all"]
    assert rec["k"] == 12 and rec["pool_size"] == 12
    assert isinstance(rec["changed"], bool) and rec["gain"] >= 0.0
    assert rec["regret_reranked_pick"] <= rec["regret_proxy_pick"] + 1e-12
    assert all(c["changed"] for c in summary["rerank_changes"])


def test_bad_setting_is_one_line_exit_2(tmp_path):
    proc = _validate("study=fidelity", "study.strategies=0", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "strategies" in proc.stderr and proc.stderr.strip().count("\n") == 0


# ----- the rules, by hand ---------------------------------------------------------------------------
NO_SPAN = {"tp": False, "ep": False, "pp": False}


@pytest.mark.parametrize(("category", "latency", "spans", "flags"), [
    ({"compute": 10.0}, 0.0, NO_SPAN, ["compute_bound"]),
    ({"compute": 7.0, "bubble": 3.0}, 0.0, NO_SPAN, ["bubble_heavy"]),
    ({"compute": 7.5, "comm:ep": 2.5}, 0.9, NO_SPAN, ["all_to_all_heavy", "latency_bound"]),
    ({"compute": 8.5, "comm:ep": 1.5}, 0.2, NO_SPAN | {"ep": True}, ["inter_node", "bandwidth_bound"]),
    ({"compute": 8.5, "comm:tp": 1.5}, 0.2, NO_SPAN | {"ep": True}, ["bandwidth_bound"]),
    ({"compute": 9.5, "comm:tp": 0.5}, 0.9, NO_SPAN, ["compute_bound"]),
])
def test_classify_rules(category, latency, spans, flags):
    assert classify(category, 10.0, latency, spans) == flags
    assert primary(flags) == flags[0]


def test_collective_profile_spans_and_message_sizes():
    ctx = make_ctx("mixtral-8x7b", gpus=16)  # two NVLink domains of 8
    # tp8 ep2: the EP group strides a whole domain; tp2 pp8 (16 GPUs in the pipeline): sends cross; tp1: none
    keys = np.array([[8, 2, 1, 1, 16, 1] + [0] * 12, [2, 1, 8, 1, 16, 1] + [0] * 12,
                     [1, 1, 1, 16, 16, 1] + [2] * 12])
    prof = collective_profile(ctx, keys)
    assert prof["spans_ep"].tolist() == [True, False, False]
    assert prof["spans_pp"].tolist() == [False, True, False]
    assert not prof["spans_tp"].any()
    assert prof["latency_share"][2] == 0.0  # replicated everywhere, one GPU per replica: no collective
    decode = collective_profile(make_ctx("llama-3.1-70b", gpus=8), np.array([[8, 1, 1, 1, 1, 1] + [0] * 12]))
    prefill = collective_profile(make_ctx("llama-3.1-70b", gpus=8, phase="prefill", input_len=8192),
                                 np.array([[8, 1, 1, 1, 8, 1] + [0] * 12]))
    assert decode["latency_share"][0] > 0.5 > prefill["latency_share"][0]  # one token vs 64k tokens
    # 80 layers split evenly: the last stage, which also runs the LM head, is the proxy's critical one
    stages = collective_profile(make_ctx("llama-3.1-70b", gpus=8), np.array(
        [[1, 1, 2, 4, 8, 1] + [0] * 12, [1, 1, 1, 8, 8, 1] + [0] * 12, [1, 1, 4, 2, 8, 2] + [0] * 12]))
    assert stages["critical_stage"].tolist() == [1, 0, 3]


def test_agreement_and_top_overlap_by_hand():
    a = np.array([1.0, 2.0, 3.0, 4.0])
    assert rank_agreement(a, a * 2)["kendall_tau"] == pytest.approx(1.0)
    assert rank_agreement(a, -a)["spearman"] == pytest.approx(-1.0)
    assert rank_agreement(a, np.ones(4))["kendall_tau"] is None
    # proxy's best two {3, 2}; simulator's valid best two {3, 1} (index 2 is invalid there)
    assert top_overlap(a, np.array([1.0, 3.0, 5.0, 4.0]), np.array([True, True, False, True]), 2)["overlap"] == 1


def test_rerank_by_hand():
    proxy, sim = np.array([10.0, 9.0, 8.0, 1.0]), np.array([7.0, 9.0, 8.0, 20.0])
    rec = rerank(proxy, sim, np.ones(4, bool), np.ones(4, bool), k=3)
    assert (rec["proxy_pick"], rec["reranked_pick"], rec["changed"]) == (0, 1, True)
    assert rec["gain"] == pytest.approx(9 / 7 - 1) and rec["proxy_loss"] == pytest.approx(-0.1)
    assert rec["regret_proxy_pick"] == pytest.approx(1 - 7 / 20) and rec["regret_reranked_pick"] == pytest.approx(
        1 - 9 / 20)
    rec = rerank(proxy, sim, np.array([True, False, True, True]), np.ones(4, bool), k=3)
    assert rec["reranked_pick"] == 2  # the simulator's best is invalid there (misses an SLO)
    assert rerank(proxy, sim, np.ones(4, bool), np.array([True, False, False, False])) is None


def test_ratio_stats_counts_large_disagreements():
    s = ratio_stats(np.array([1.0, 1.02, 0.9, 1.2, np.nan]), large=0.05)
    assert s["n"] == 4 and s["share_large"] == pytest.approx(0.5) and s["max"] == pytest.approx(1.2)


def test_deltas_sum_to_the_step_difference_and_name_the_cause():
    proxy = {"compute": 10e-3, "comm:tp": 3e-3, "comm:pp": 1e-3, "bubble": 2e-3}  # step 16 ms
    sim = {"compute": 10e-3, "exposed_comm": 1e-3, "bubble": 0.5e-3, "idle": 2e-3}  # step 13.5 ms
    d = deltas(proxy, sim)
    assert sum(d.values()) == pytest.approx(13.5e-3 - 16e-3)
    assert d["comm"] == pytest.approx(-3e-3) and dominant_cause(d) == "overlap"
    assert "overlap hides 3 ms of the proxy's 4 ms" in explain(proxy, sim, 0.1)
    slower = {"compute": 10e-3, "exposed_comm": 9e-3, "bubble": 0.0, "idle": 2e-3}
    assert dominant_cause(deltas(proxy, slower)) == "contention"
    assert "80% busy" in explain(proxy, slower, 0.8)


def test_overlap_contention_split():
    assert "overlap hides 10.0%" in overlap_contention_why(0.9, 0.9)
    assert "link sharing adds 10.0%" in overlap_contention_why(1.0, 1.1)
    assert overlap_contention_why(1.0, 1.0).startswith("no difference")


def _row(i: int, sim: float, error: str = "") -> dict:
    proxy = 10.0 - i
    return {"scenario": "x", "source": "random", "key": str(i), "tp": 1, "ep": 1, "pp": 1, "dp": 8, "batch": 8,
            "microbatches": 1, "sharding": "megatron", "proxy_tokens_per_s_per_gpu": proxy,
            "sim_tokens_per_s_per_gpu": sim, "sim_valid": not error, "ratio": proxy / sim,
            "regimes": "compute_bound", "regime": "compute_bound", "large": False, "cause": "", "trajectory": "none",
            "scenario_wall_s": 1.0, "sim_wall_s": 0.1, "sim_error": error}


def test_scenario_figures_by_hand_leave_out_simulator_failures():
    from validation.studies.fidelity.report import scenario_summary

    s = scenario_summary([_row(0, 9.0), _row(1, 9.5), _row(2, 8.0), _row(3, float("nan"), "RuntimeError: x")])
    assert s["strategies"] == 3 and [f["key"] for f in s["sim_errors"]] == ["3"]
    assert s["kendall_tau"] == pytest.approx(1 / 3)  # one discordant pair of three
    rec = s["rerank"]["all"]
    assert (rec["proxy_pick"], rec["reranked_pick"]) == (0, 1) and rec["gain"] == pytest.approx(9.5 / 9 - 1)


def test_a_simulator_exception_becomes_a_row_error(monkeypatch):
    from validation.studies.fidelity import simulate as fidelity_simulate

    def boom(*args, **kwargs):
        raise RuntimeError("preempted\nsecond line")

    monkeypatch.setattr(fidelity_simulate, "simulate", boom)
    out = fidelity_simulate._simulate_one(("dense-70b-1node", (8, 1, 1, 1, 8, 1) + (0,) * 12, True))
    assert out["error"] == "RuntimeError: preempted" and out["step_time_s"] != out["step_time_s"]


# --- three-way fidelity: proxy, simulator and measurement (validation/studies/fidelity/measured.py) ---

def _three_way_row(measured, proxy, sim, regime="inference", split="test"):
    from validation.studies.fidelity.measured import _row

    return _row(regime, "f.csv:2", split, "case", "time_s", measured, proxy, sim, "contention", "because")


def test_three_way_row_names_the_closer_only_where_the_two_differ():
    near = _three_way_row(100.0, 100.0, 104.0)  # 4% apart: not a departure
    assert not near["differ"] and near["closer"] == "" and near["cause"] == ""
    sim_closer = _three_way_row(110.0, 100.0, 108.0)
    assert sim_closer["differ"] and sim_closer["closer"] == "simulator" and sim_closer["cause"] == "contention"
    assert sim_closer["proxy_rel_error"] == pytest.approx(-1 / 11) and sim_closer["sim_over_proxy"] == pytest.approx(0.08)
    assert _three_way_row(100.0, 101.0, 90.0)["closer"] == "proxy"


def test_three_way_summary_counts_by_regime_and_split(tmp_path):
    from validation.studies.fidelity.measured_report import BEGIN, END, summarize, write_section

    rows = [_three_way_row(110.0, 100.0, 108.0), _three_way_row(100.0, 101.0, 90.0, split="fit"),
            _three_way_row(100.0, 100.0, 100.0, regime="collectives")]
    s = summarize(rows)
    inf = s["regimes"]["inference"]
    assert (inf["all"]["rows"], inf["all"]["differ"], inf["all"]["sim_closer"], inf["all"]["proxy_closer"]) == (2, 2, 1, 1)
    assert inf["fit"]["rows"] == 1 and inf["test"]["rows"] == 1 and inf["all"]["causes"] == {"contention": 2}
    assert s["headline"]["collectives_differ"] == 0 and s["headline"]["rows"] == 3
    report = tmp_path / "report.md"
    report.write_text("# Fidelity\n\nkept text\n")
    write_section(report, s, rows)
    write_section(report, s, rows)  # a second run replaces the section, it does not add one
    text = report.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and "kept text" in text
    assert "| inference | fit | 1 |" in text and "| inference | test | 1 |" in text


def test_three_way_rows_from_the_shipped_data_are_labelled_and_explained():
    from validation.studies.fidelity.measured import collective_rows, deepep_rows, inference_rows

    rows = collective_rows(limit=2) + deepep_rows(limit=2) + inference_rows(limit=2)
    assert {r["regime"] for r in rows} == {"collectives", "deepep", "inference"}
    assert all(r["split"] in ("fit", "test") for r in rows)
    assert all(r["measured"] > 0 and r["proxy"] > 0 and r["sim"] > 0 for r in rows)
    for r in rows:
        assert (r["cause"] != "") == r["differ"]  # every departure is explained, no other row is
    deepep = [r for r in rows if r["regime"] == "deepep"]
    assert all(r["sim_deepep"] > 0 for r in deepep)  # DeepEP's per-rank formula on the same routing draw
    assert all(r["cause"] in ("", "skew", "algorithm") for r in deepep)


def test_quick_run_has_the_three_way_section(quick_run):
    from validation.studies.fidelity.measured_report import BEGIN

    out, _, _, proc = quick_run
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    three = last["headline"]["three_way"]
    assert three["study"] == "fidelity-measured" and three["deepep_rows"] > 0 and three["inference_rows"] > 0
    assert BEGIN in (out / "report.md").read_text()
    with open(out / "measured.csv") as fh:
        assert {r["split"] for r in csv.DictReader(fh)} <= {"fit", "test"}
