"""shard-report over a fake multirun dir: two finished jobs and one failed job, and an empty dir."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf

from planner.megatron import megatron_search
from simcore.cost.proxy import evaluate
from topologies.scenario import build_context
from validation.report import collect, curves_plot
from validation.report.curves import read_curve

ENTRY = "from validation.apps.report import main; main()"
LOG_ERROR = "error: topology.num_nodes must be positive, got 0"


def _config(experiment: str) -> DictConfig:
    from planner.apps.search import register

    register()
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="search", overrides=[f"experiment={experiment}", "planner.batch=[64,256]"])


def _finished_job(job: Path, cfg: DictConfig, strategy_rank: int = 0) -> dict:
    ctx = build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload)
    ranked = megatron_search(ctx)
    best = evaluate(ctx, ranked.strategy(strategy_rank))
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    results = {"scenario": cfg.scenario, "planner": "megatron", "calls": ranked.calls, "wall_s": 0.5,
               "best": best.to_dict(), "proxy_tokens_per_s_per_gpu": best.tokens_per_s_per_gpu,
               "config": OmegaConf.to_container(cfg, resolve=True)}
    (job / "results.json").write_text(json.dumps(results))
    return results


@pytest.fixture(scope="module")
def multirun(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun")
    dense = _finished_job(root / "0_experiment=dense-70b-1node", _config("dense-70b-1node"), strategy_rank=3)
    (root / "0_experiment=dense-70b-1node" / "summary.json").write_text(json.dumps(
        {"sim_tokens_per_s_per_gpu": 1234.5, "megatron": {"tokens_per_s_per_gpu": 1000.0}}))
    (root / "0_experiment=dense-70b-1node" / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"call": c, "best": b}) for c, b in [(10, 900.0), (20, 950.0), (40, 990.0)]))
    moe_cfg = _config("mixtral-2node")
    moe = _finished_job(root / "1_experiment=mixtral-2node", moe_cfg)
    failed = root / "2_topology.num_nodes=0"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(moe_cfg))
    (failed / "search.log").write_text(f"[2026-01-01 00:00:00][HYDRA] job started\n{LOG_ERROR}\n")
    return root, dense, moe, moe_cfg


@pytest.fixture(scope="module")
def report(multirun):
    from validation.apps.report import run

    root = multirun[0]
    rows = run(OmegaConf.create({"dir": str(root), "out": None, "megatron": True, "simulate": True}))
    return rows, root


def test_table_has_every_job_and_names_the_failed_one(report, multirun):
    rows, root = report
    _, dense, moe, _ = multirun
    assert [r["status"] for r in rows] == ["ok", "ok", "failed"]
    assert [r["model"] for r in rows] == ["llama-3.1-70b", "mixtral-8x22b", "mixtral-8x22b"]
    assert rows[2]["job"] == "2_topology.num_nodes=0" and rows[2]["error"] == LOG_ERROR
    d = dense["best"]["strategy"]
    assert rows[0]["plan"] == f"tp{d['tp']} ep{d['ep']} pp{d['pp']} dp{d['dp']} b{d['batch']} mb{d['microbatches']}"
    assert rows[0]["topology"] == "hgx-h100" and rows[0]["gpus"] == 8 and rows[1]["gpus"] == 16


def test_figures_come_from_the_summary_or_are_computed(report, multirun):
    rows, _ = report
    _, dense, moe, moe_cfg = multirun
    assert rows[0]["sim_tokens_per_s_per_gpu"] == 1234.5 and rows[0]["sim_source"] == "job summary"
    assert rows[0]["ratio_to_megatron"] == round(dense["proxy_tokens_per_s_per_gpu"] / 1000.0, 4)
    ctx = build_context(moe_cfg.model, moe_cfg.hardware, moe_cfg.topology, moe_cfg.workload)
    from planner.space import SearchSpace

    ranked = megatron_search(ctx, SearchSpace.for_context(ctx, batch=(64, 256)))  # the job's planner.batch
    expected = float(ranked.result.tokens_per_s_per_gpu[ranked.order[0]])
    assert rows[1]["megatron_source"] == "computed"
    assert rows[1]["megatron_tokens_per_s_per_gpu"] == round(expected, 2)
    assert rows[1]["ratio_to_megatron"] == round(moe["proxy_tokens_per_s_per_gpu"] / expected, 4)
    assert rows[1]["sim_source"] == "computed" and rows[1]["sim_tokens_per_s_per_gpu"] > 0


def test_csv_and_pngs_are_written(report):
    rows, root = report
    with open(root / "report.csv", newline="") as fh:
        csv_rows = list(csv.DictReader(fh))
    assert [r["job"] for r in csv_rows] == [r["job"] for r in rows]
    assert csv_rows[2]["error"] == LOG_ERROR and csv_rows[0]["megatron_source"] == "job summary"
    for name in ("throughput.png", "search_curves.png"):
        assert (root / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_curves_from_metrics_and_candidates(tmp_path):
    (tmp_path / "candidates.csv").write_text(
        "call,tokens_per_s_per_gpu,valid\n1,10,true\n2,30,false\n3,20,true\n4,nan,false\n5,40,true\n")
    curve = read_curve(tmp_path, {})
    assert curve.source == "candidates.csv"
    assert curve.calls == (1, 2, 3, 4, 5) and curve.best == (10, 10, 20, 20, 40)
    (tmp_path / "metrics.jsonl").write_text('{"call": 4, "best": null}\n{"call": 8, "best": 7.5}\n')
    assert read_curve(tmp_path, {}).best == (7.5,)  # metrics.jsonl wins; empty points dropped
    assert read_curve(tmp_path, {"search_curve": [[1, 2.0], [3, 4.0]]}).calls == (1, 3)


def test_no_curve_data_skips_that_plot(multirun, tmp_path):
    root = multirun[0]
    jobs = [j for j in collect(root) if j.curve is None]
    assert jobs and curves_plot(jobs, tmp_path / "c.png") is None and not (tmp_path / "c.png").exists()


def test_cli_report_and_empty_dir(multirun, tmp_path):
    root = multirun[0]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", ENTRY, str(root), f"out={out}", "simulate=false"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2_topology.num_nodes=0" in proc.stdout and str(out) in proc.stdout
    assert (out / "report.csv").is_file() and (out / "throughput.png").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-c", ENTRY, str(empty)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "no jobs" in proc.stderr


def test_unreadable_results_are_reported_not_fatal(tmp_path):
    job = tmp_path / "0_x"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"model": {"name": "llama-3.1-70b"}}))
    (job / "results.json").write_text("{not json")
    [j] = collect(tmp_path)
    assert j.status == "failed" and j.error.startswith("unreadable results") and j.model == "llama-3.1-70b"
