"""Newcomer paths: shard-sim with no plan simulates the best Megatron plan; apps say where they wrote;
simcore stays free of planner imports; the model's parameter counts reach summary.json and result.json."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from hydra import compose, initialize_config_module

from simcore.config import build_space
from simcore.models import get_model
from tests.test_apps import ROOT, app
from topologies.scenario import build_context


def test_sim_without_a_plan_simulates_the_best_megatron_plan(tmp_path: Path) -> None:
    import planner.apps.sim  # noqa: F401  (registers sim_schema)
    from simcore.space.megatron import megatron_search

    proc = app("sim", "experiment=dense-70b-1node", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no plan given: simulating the best Megatron plan of dense-70b-1node" in proc.stdout
    assert f"run dir: {tmp_path}" in proc.stdout and "result.json" in proc.stdout
    result = json.loads((tmp_path / "result.json").read_text())
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="sim", overrides=["experiment=dense-70b-1node"])
    ctx = build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload, cfg.sim)
    ranked = megatron_search(ctx, build_space(ctx, cfg.planner))
    assert result["strategy_source"] == "best Megatron plan"
    assert result["proxy"]["strategy"] == ranked.strategy(0).to_dict()
    assert result["proxy"]["tokens_per_s_per_gpu"] == float(ranked.result.tokens_per_s_per_gpu[ranked.order[0]])
    assert result["model"]["total_params"] == get_model("llama-3.1-70b").total_params()


def test_sim_with_a_strategy_on_the_command_line_prices_that_strategy(tmp_path: Path) -> None:
    proc = app("sim", "experiment=dense-70b-1node", "strategy.tp=8", "strategy.batch=16",
               f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Megatron plan" not in proc.stdout
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["strategy_source"] == "command line"
    assert (result["proxy"]["strategy"]["tp"], result["proxy"]["strategy"]["batch"]) == (8, 16)


def test_sim_with_no_valid_megatron_plan_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = app("sim", "experiment=dense-70b-1node", "model=llama-3.1-405b", "workload.precision=bf16",
               f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: strategy:") and "no Megatron plan" in line and "hbm_capacity" in line


def test_search_summary_carries_the_model_parameter_counts(tmp_path: Path) -> None:
    proc = app("search", "experiment=mixtral-2node", "planner=megatron", "planner.reranker=proxy",
               "planner.reference_lines=false", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"run dir: {tmp_path}" in proc.stdout
    model = json.loads((tmp_path / "summary.json").read_text())["model"]
    spec = get_model("mixtral-8x22b")
    assert (model["total_params"], model["active_params"]) == (spec.total_params(), spec.active_params())
    assert model["num_experts"] == 8 and model["active_params"] < model["total_params"]


def test_simcore_never_imports_planner() -> None:
    offenders = []
    for path in (ROOT / "simcore").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "planner"]
    assert not offenders


def test_one_copy_of_the_megatron_search() -> None:
    import planner.megatron
    import planner.space
    import simcore.space.bounds
    import simcore.space.megatron

    assert planner.megatron.megatron_search is simcore.space.megatron.megatron_search
    assert planner.space.SearchSpace is simcore.space.bounds.SearchSpace
