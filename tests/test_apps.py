"""The console apps end to end: files written, plans replayable, bad input as one line with exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module

from validation.studies.common.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parent.parent
ENTRY = {
    "search": "from planner.apps.search import main; main()",
    "sim": "from planner.apps.sim import main; main()",
    "validate": "from validation.apps.validate import main; main()",
    "report": "from validation.apps.report import main; main()",
}


def app(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRY[name], *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def search_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("search")
    proc = app("search", "experiment=dense-70b-1node", "planner=megatron", f"hydra.run.dir={out}", cwd=out)
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ppo")
    proc = app("search", "experiment=dense-70b-1node", "planner.budget=120", "planner.d_model=32",
               "planner.hidden=32", "planner.rerank_k=4", "seed=3", f"hydra.run.dir={out}", cwd=out)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_search_writes_results_and_a_replayable_plan(search_run):
    out, proc = search_run
    results = json.loads((out / "results.json").read_text())
    assert results["planner"] == "megatron" and results["calls"] > 10
    assert results["best"]["valid"] and results["proxy_tokens_per_s_per_gpu"] > 0
    plan = yaml.safe_load((out / "best_plan.yaml").read_text())
    assert plan["strategy"]["tp"] * plan["strategy"]["pp"] * plan["strategy"]["dp"] == 8
    assert str(out) in proc.stdout
    sim_out = out / "sim"
    sim = app("sim", "experiment=dense-70b-1node", f"plan={out / 'best_plan.yaml'}", f"hydra.run.dir={sim_out}",
              cwd=out)
    assert sim.returncode == 0, sim.stderr
    replay = json.loads((sim_out / "result.json").read_text())["proxy"]
    assert replay["tokens_per_s_per_gpu"] == pytest.approx(results["proxy_tokens_per_s_per_gpu"], rel=1e-9)


def test_default_planner_is_ppo_and_writes_every_output(ppo_run):
    out, proc = ppo_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["planner"] == "ppo" and summary["seed"] == 3 and summary["calls"] == 120
    assert summary["reranker"] == "sim" and summary["sim_tokens_per_s_per_gpu"] > 0
    assert summary["sim_tokens_per_s_per_gpu"] == summary["reranked_tokens_per_s_per_gpu"]
    assert 0 < summary["fraction_of_exact"] <= 1 + 1e-12 and summary["wall_s"] > 0
    results = json.loads((out / "results.json").read_text())
    assert {"best", "planner", "calls", "wall_s", "scenario", "config"} <= set(results)
    rows = (out / "candidates.csv").read_text().splitlines()
    assert len(rows) == 121 and rows[0].startswith("call,tp,ep,pp,dp,batch,microbatches,embedding")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics and {"approx_kl", "clipfrac", "entropy", "explained_variance"} <= set(metrics[0])
    assert (out / "search_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "proxy #" in proc.stdout and "sharding vs Megatron" in proc.stdout and "cand/s" in proc.stdout
    sim_out = out / "sim"
    sim = app("sim", "experiment=dense-70b-1node", f"plan={out / 'best_plan.yaml'}", f"hydra.run.dir={sim_out}",
              cwd=out)
    assert sim.returncode == 0, sim.stderr
    replay = json.loads((sim_out / "result.json").read_text())["proxy"]
    assert replay["tokens_per_s_per_gpu"] == pytest.approx(summary["proxy_tokens_per_s_per_gpu"], rel=1e-9)


def test_unknown_planner_names_the_closest_choices(tmp_path):
    proc = app("search", "planner=ppo3", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: planner: unknown option 'ppo3'; closest: ppo")
    assert "_schema" not in proc.stderr  # the schemas behind the options are no choice of the user's


@pytest.mark.slow
def test_sigint_saves_and_resume_matches_an_uninterrupted_run(tmp_path):
    import signal
    import time

    args = ["experiment=dense-70b-1node", "planner.budget=500", "planner.reference_lines=false", "seed=5"]
    whole = tmp_path / "whole"
    assert app("search", *args, f"hydra.run.dir={whole}", cwd=tmp_path).returncode == 0
    cut = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-c", ENTRY["search"], *args, f"hydra.run.dir={cut}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if len(list(cut.glob("checkpoint.pkl"))) and (cut / ".hydra").exists():
            time.sleep(2.0)  # past the warm start: somewhere inside the first chunks
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "+resume=" in err and err.strip().count("\n") == 0, err
    assert not (cut / "results.json").exists()
    resumed = app("search", *args, f"+resume={cut}", f"hydra.run.dir={tmp_path / 'again'}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    a, b = (json.loads((d / "results.json").read_text()) for d in (whole, cut))
    assert a["best"] == b["best"] and a["calls"] == b["calls"]
    assert (whole / "candidates.csv").read_text() == (cut / "candidates.csv").read_text()
    other = app("search", *args, "planner.budget=400", f"+resume={cut}", f"hydra.run.dir={tmp_path / 'x'}",
                cwd=tmp_path)
    assert other.returncode == 2 and "planner.budget" in other.stderr


def test_report_gathers_jobs(search_run, tmp_path):
    out, _ = search_run
    proc = app("report", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "dense-70b-1node" in (out / "report.csv").read_text()
    empty = app("report", str(tmp_path), cwd=tmp_path)
    assert empty.returncode == 2 and empty.stderr.strip().count("\n") == 0 and "no jobs" in empty.stderr


@pytest.mark.parametrize(("args", "field"), [
    (["model.name=gpt-7"], "unknown model"),
    (["workload.input_len=0"], "workload.input_len"),
    (["workload.kv_precision=int4"], "workload.kv_precision"),
    (["topology.num_nodes=0"], "num_nodes"),
    (["planner.batch=[0,4]"], "batch"),
    (["planner.name=ppo2"], "planner.name"),
    (["planner=poolwise"], "serving plans only"),  # a serving-only planner on a static search
    (["planner.budget=0"], "planner.budget"),
    (["planner.T=0"], "planner.T"),
    (["planner.tau=1.5"], "planner.tau"),
    (["planner=random", "planner.temperature=2"], "planner.temperature"),  # a knob planner=random lacks
    (["planner=random", "+planner.T=3"], "planner.T"),  # appended: refused by the app's key check
    (["+resume=/nonexistent/run"], "no checkpoint"),
    (["+hardware.overrides.hbm_speed=1"], "hbm_speed"),
    # each had been accepted and ignored or replaced by a default (top was never read)
    (["seed=-1"], "seed must be"),
    (["planner.max_tp=0"], "planner.max_tp"),
    (["planner.batch=[]"], "planner.batch"),
    (["planner.microbatches=[0]"], "planner.microbatches"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, field):
    proc = app("search", "experiment=dense-70b-1node", f"hydra.run.dir={tmp_path}", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr


def test_the_unread_top_setting_is_gone(tmp_path):
    """``top`` was in the search schema from the start but never read: now refused as unknown (Hydra's
    own message, naming the key; exit 2) rather than accepted and ignored."""
    proc = app("search", "experiment=dense-70b-1node", "top=3", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "error: top: unknown key" in proc.stderr, proc.stderr


def test_malformed_config_json_is_one_line(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": -5}')
    proc = app("search", "experiment=dense-70b-1node", f"model.name={bad}", f"hydra.run.dir={tmp_path}",
               cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr


def test_plan_with_unknown_operator_is_rejected(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("strategy: {tp: 8, sharding: {ffn7: dim0}}\n")
    proc = app("sim", f"plan={plan}", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "ffn7" in proc.stderr, proc.stderr


def _one_line(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_unknown_group_option_lists_choices(tmp_path):
    line = _one_line(app("search", "model=gpt-7", cwd=tmp_path))
    assert line.startswith("error: model: unknown model 'gpt-7'") and "closest: " in line and "search path" not in line


@pytest.mark.parametrize("name", ["search", "sim", "validate", "report"])
def test_a_value_of_the_wrong_type_exits_2_naming_the_key(tmp_path, name):
    key = {"search": "planner.polish", "sim": "sim.contention", "validate": "study.quick", "report": "megatron"}[name]
    assert key in _one_line(app(name, f"{key}=maybe", f"hydra.run.dir={tmp_path}", cwd=tmp_path))


@pytest.mark.parametrize("name", ["search", "sim", "validate", "report"])
def test_an_unknown_key_or_a_malformed_override_is_one_line(tmp_path, name):
    key = {"search": "serving.arrival", "sim": "sim.contentions", "validate": "study.quik", "report": "bogus"}[name]
    line = _one_line(app(name, f"{key}=1", f"hydra.run.dir={tmp_path}", cwd=tmp_path))
    assert f"{key}: unknown key" in line and f"+{key}=1" not in line  # never the advice to append it
    assert "planner.budget=[" in _one_line(app(name, "planner.budget=[", f"hydra.run.dir={tmp_path}", cwd=tmp_path))


def test_hydra_full_error_set_by_the_user_keeps_hydras_report(tmp_path):
    import os

    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run([sys.executable, "-c", ENTRY["search"], "serving.arrival=1", f"hydra.run.dir={tmp_path}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ConfigCompositionException" in proc.stderr


def test_config_error_line_joins_a_list_and_drops_what_names_no_field():
    from hydra.errors import ConfigCompositionException, OverrideParseException
    from omegaconf.errors import ValidationError

    from planner.apps.common import config_error_line

    missing = ConfigCompositionException("In 'x': Could not find 'topology/m'\n\nAvailable options in 'topology':\n"
                                         "\ta\n\tb\nConfig search path:\n\tprovider=main, path=pkg://conf")
    assert config_error_line(missing) == "topology: unknown option 'm'; known: a, b"
    nested = ConfigCompositionException("In 'x': Could not find 'hardware/m'")
    assert config_error_line(nested) == "In 'x': Could not find 'hardware/m'"
    merged = ConfigCompositionException("Error merging override p.q=maybe")
    merged.__cause__ = ValidationError("Value 'maybe' is not a valid bool\n    full_key: p.q\n    object_type=P")
    assert config_error_line(merged) == "Error merging override p.q=maybe; Value 'maybe' is not a valid bool"
    assert config_error_line(OverrideParseException("a=[", "no viable alternative")) == "a=[: no viable alternative"


@pytest.mark.parametrize("name", ["search", "sim", "validate", "report"])
def test_an_appended_unknown_key_exits_2_naming_it(tmp_path, name):
    key = {"search": "workload.fabric", "sim": "topology.bogus", "validate": "study.bogus", "report": "bogus"}[name]
    proc = app(name, f"+{key}=1", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and f"{key}: unknown setting" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_serving_study_jobs_below_one_is_one_line_exit_2(tmp_path, jobs):
    proc = app("validate", "study=serving", f"study.jobs={jobs}", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "study.jobs" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _group_options(group: str) -> list[str]:
    if group == "model":  # served from the catalog (planner.apps.model_catalog), not from files
        from simcore.models import MODEL_NAMES

        return sorted(MODEL_NAMES)
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["model", "hardware", "topology", "workload", "planner", "sim", "experiment"])
def test_every_option_of_every_group_composes(group):
    from planner.apps.search import register

    register()
    from planner.apps.common import check_known_keys
    from planner.apps.search import SearchAppConfig
    from planner.apps.sim import SimAppConfig

    with initialize_config_module(config_module="conf", version_base=None):
        for option in _group_options(group):
            cfg = compose(config_name="search", overrides=[f"{group}={option}"])
            assert cfg[group if group != "experiment" else "scenario"] is not None
            check_known_keys(cfg, SearchAppConfig)  # every shipped option sets only known keys
            if group != "planner":  # shard-sim has no planner group
                check_known_keys(compose(config_name="sim", overrides=[f"{group}={option}"]), SimAppConfig)


def test_scenarios_are_the_benchmark_set():
    assert {"dense-70b-1node", "mixtral-2node", "deepseek-8node", "gptmoe-1.6t-16k", "gptmoe-1.6t-32k",
            "gptmoe-1.6t-64k", "dense-70b-prefill"} <= set(SCENARIOS)


def test_scenario_configs_compose_inside_a_running_hydra_app():
    """Studies compose scenario configs while ``shard-validate`` holds Hydra's global state."""
    from hydra.core.global_hydra import GlobalHydra

    from validation.studies.common.scenarios import scenario_config

    with initialize_config_module(config_module="conf", version_base=None):
        app = GlobalHydra.instance().hydra
        assert scenario_config("mixtral-2node").topology.num_nodes == 2
        assert GlobalHydra.instance().hydra is app       # the app's Hydra is back


@pytest.mark.parametrize("name", ["fidelity", "rewrites"])
def test_an_empty_scenario_list_is_refused_not_read_as_the_defaults(tmp_path, name):
    proc = app("validate", f"study={name}", "study.scenarios=[]", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "study.scenarios" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
