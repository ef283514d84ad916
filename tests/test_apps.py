"""The console apps end to end: files written, plans replayable, bad input as one line with exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module

from validation.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parent.parent
ENTRY = {
    "search": "from planner.apps.search import main; main()",
    "sim": "from simcore.apps.sim import main; main()",
    "validate": "from validation.apps.validate import main; main()",
    "report": "from validation.apps.report import main; main()",
}


def app(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRY[name], *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def search_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("search")
    proc = app("search", "experiment=dense-70b-1node", f"hydra.run.dir={out}", cwd=out)
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
    (["topology.num_nodes=0"], "num_nodes"),
    (["planner.batch=[0,4]"], "batch"),
    (["planner.name=ppo2"], "planner.name"),
    (["+hardware.overrides.hbm_speed=1"], "hbm_speed"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, field):
    proc = app("search", "experiment=dense-70b-1node", f"hydra.run.dir={tmp_path}", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr


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


def test_unknown_group_option_lists_choices(tmp_path):
    proc = app("search", "model=gpt-7", cwd=tmp_path)
    assert proc.returncode != 0 and "llama-3.1-70b" in proc.stderr


def _group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["model", "hardware", "topology", "workload", "planner", "sim", "experiment"])
def test_every_option_of_every_group_composes(group):
    from planner.config import register

    register()
    with initialize_config_module(config_module="conf", version_base=None):
        for option in _group_options(group):
            cfg = compose(config_name="search", overrides=[f"{group}={option}"])
            assert cfg[group if group != "experiment" else "scenario"] is not None


def test_scenarios_are_the_benchmark_set():
    assert {"dense-70b-1node", "mixtral-2node", "deepseek-8node", "gptmoe-1.6t-16k", "gptmoe-1.6t-32k",
            "gptmoe-1.6t-64k", "dense-70b-prefill"} <= set(SCENARIOS)
