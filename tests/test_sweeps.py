"""Hydra multirun sweeps (``-m``): the joblib launcher by default, one sweep subdir per job, a failing
job that does not stop the others, ``shard-report`` over the sweep; the Ray launcher (slow, optional)."""

import csv
import json
from pathlib import Path

import pytest

from tests.test_apps import app

FAST = ("experiment=dense-70b-1node", "planner=megatron", "planner.reranker=proxy", "planner.reference_lines=false")


def _jobs(sweep: Path) -> list[Path]:
    return sorted((d for d in sweep.iterdir() if d.is_dir()), key=lambda d: int(d.name.split("_")[0]))


def _report(sweep: Path, cwd: Path, *args: str) -> tuple[list[dict], str]:
    proc = app("report", str(sweep), *args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    with open(sweep / "report.csv", newline="") as fh:
        return list(csv.DictReader(fh)), proc.stdout


@pytest.fixture(scope="module")
def topology_sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("sweep")
    sweep = cwd / "multirun"
    proc = app("search", "-m", *FAST, "topology=hgx-h100,h100-ib-rail", f"hydra.sweep.dir={sweep}", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return cwd, sweep, proc


def test_joblib_is_the_default_launcher_and_each_job_writes_its_own_subdir(topology_sweep):
    cwd, sweep, proc = topology_sweep
    assert "Joblib.Parallel" in proc.stdout and "launching 2 jobs" in proc.stdout
    assert sorted(p.name for p in cwd.iterdir()) == ["multirun"]  # nothing written outside the sweep dir
    jobs = _jobs(sweep)
    assert [d.name.split("_")[0] for d in jobs] == ["0", "1"]
    for job, topology in zip(jobs, ("hgx-h100", "h100-ib-rail"), strict=True):
        assert job.name.endswith(f"topology={topology}")
        results = json.loads((job / "results.json").read_text())
        assert results["config"]["topology"]["name"] == topology and results["best"]["valid"]
        assert {"summary.json", "best_plan.yaml", "candidates.csv", "search.log"} <= {p.name for p in job.iterdir()}


def test_report_over_the_sweep_has_both_jobs(topology_sweep):
    cwd, sweep, _ = topology_sweep
    rows, out = _report(sweep, cwd)
    assert [(r["status"], r["topology"], r["gpus"]) for r in rows] == [("ok", "hgx-h100", "8"),
                                                                          ("ok", "h100-ib-rail", "8")]
    assert all(float(r["proxy_tokens_per_s_per_gpu"]) > 0 and r["sim_tokens_per_s_per_gpu"] for r in rows)
    assert "0_topology=hgx-h100" in out and "1_topology=h100-ib-rail" in out  # shared overrides dropped
    assert "2/2 job(s) ok" in out and (sweep / "throughput.png").is_file()
    assert not (cwd / "report.log").exists()  # the report leaves nothing in the working directory


def test_a_failing_job_does_not_stop_the_sweep_and_the_report_names_it(tmp_path):
    """Job 0 has bad input (exit 2 when run alone), job 2 has no plan that fits: both are recorded,
    jobs 1 and 3 still run; Hydra ends the sweep non-zero because a job failed."""
    sweep = tmp_path / "multirun"
    proc = app("search", "-m", *FAST, "model=llama-3.1-70b,deepseek-v3", "topology.num_nodes=0,1",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 2 and "error: topology.num_nodes must be positive, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1] == (
        "error: a job of the sweep had bad input: topology.num_nodes must be positive, got 0 "
        "(`shard-report` lists every job)"), proc.stderr
    jobs = _jobs(sweep)
    assert len(jobs) == 4 and [(j / "results.json").is_file() for j in jobs] == [False, True, False, True]
    rows, out = _report(sweep, tmp_path, "simulate=false")
    assert [r["status"] for r in rows] == ["failed", "ok", "failed", "no valid plan"]
    assert rows[0]["error"] == "error: topology.num_nodes must be positive, got 0"
    assert rows[1]["model"] == "llama-3.1-70b" and float(rows[1]["proxy_tokens_per_s_per_gpu"]) > 0
    assert rows[3]["model"] == "deepseek-v3" and "hbm_capacity" in rows[3]["error"]
    assert "1/4 job(s) ok" in out and "3 failed, unfinished or without a valid plan" in out


def test_a_misspelled_option_in_a_sweep_lists_the_choices_and_starts_no_job(tmp_path):
    sweep = tmp_path / "multirun"
    proc = app("search", "-m", *FAST, "topology=hgx-h100,h100-ib-rial", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "topology: unknown option 'h100-ib-rial'; closest: h100-ib-rail" in proc.stderr
    assert not sweep.exists() or not [d for d in sweep.iterdir() if d.is_dir()]


def test_shard_sim_sweeps_with_joblib(tmp_path):
    sweep = tmp_path / "multirun"
    proc = app("sim", "-m", "experiment=dense-70b-1node", "strategy.tp=8", "strategy.batch=16,32",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Joblib.Parallel" in proc.stdout
    batches = [json.loads((j / "result.json").read_text())["proxy"]["strategy"]["batch"] for j in _jobs(sweep)]
    assert batches == [16, 32]


@pytest.mark.slow
def test_ray_launcher_runs_a_sweep_on_a_local_instance(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    sweep = tmp_path / "multirun"
    proc = app("search", "-m", *FAST, "topology=hgx-h100,h100-ib-rail", "hydra/launcher=ray",
               "+hydra.launcher.ray.init.num_cpus=2", "+hydra.launcher.ray.init.include_dashboard=false",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Ray Launcher is launching 2 jobs" in proc.stdout
    rows, _ = _report(sweep, tmp_path, "simulate=false")
    assert [(r["status"], r["topology"]) for r in rows] == [("ok", "hgx-h100"), ("ok", "h100-ib-rail")]
