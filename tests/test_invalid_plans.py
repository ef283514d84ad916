"""Only valid answers are answers; memory is shown.

``shard-sim`` refuses an invalid plan (memory, divisibility, a plan for another cluster) as bad input: one
line naming each reason and its numbers, exit 2, before any table or simulation; ``sim.allow_invalid=true``
keeps the what-if view with every throughput marked INVALID. The memory of the fullest GPU is shown by part.
``candidates.csv`` and the re-ranked table carry ``valid`` / ``invalid_reason`` and no throughput for an
invalid plan, and nothing ranks one.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from planner.rerank import best_valid, rerank
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import memory_breakdown, memory_per_gpu_bytes
from simcore.cost.proxy import evaluate
from simcore.strategy.sharding import Strategy
from validation.studies.common.scenarios import scenario_context

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
OVER_HBM = ("experiment=dense-70b-1node", "strategy.tp=1", "strategy.dp=8", "strategy.batch=64")


def _run(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: strategy: "), proc.stderr
    return lines[0]


def test_a_plan_over_hbm_is_refused_in_one_line_with_its_memory(tmp_path):
    proc = _run("shard-sim", *OVER_HBM, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    line = _one_error_line(proc)
    assert line.startswith("error: strategy: hbm_capacity: ") and "GB per GPU (weights " in line
    assert all(part in line for part in ("KV ", "activations ", "workspace ")) and "GB on h100-sxm" in line
    ctx = scenario_context("dense-70b-1node")
    memory = memory_breakdown(ctx, Strategy.from_dict({"tp": 1, "dp": 8, "batch": 64}))
    assert f"{memory.total_bytes / 1e9:.1f} GB per GPU" in line and f"> {memory.capacity_bytes / 1e9:.1f} GB" in line
    assert "tokens/s/GPU" not in proc.stdout + proc.stderr and "1,748" not in proc.stdout + proc.stderr
    assert proc.stdout.strip() == ""  # no table
    assert not (tmp_path / "run" / "result.json").exists()  # nothing simulated, nothing written


def test_a_degree_that_does_not_divide_is_refused_before_any_table(tmp_path):
    proc = _run("shard-sim", "experiment=dense-70b-1node", "strategy.tp=3", f"hydra.run.dir={tmp_path / 'run'}",
                cwd=tmp_path)
    line = _one_error_line(proc)
    assert "device_count: tp*ep*pp*dp = 3*1*1*1 = 3 GPUs, the cluster has 8" in line
    assert "heads_divisibility: 64 heads, 8 KV heads over tp=3" in line
    assert proc.stdout.strip() == "" and not (tmp_path / "run" / "result.json").exists()


def test_a_plan_replayed_on_another_cluster_names_the_cluster_it_was_made_for(tmp_path):
    plan = tmp_path / "best_plan.yaml"
    plan.write_text(yaml.safe_dump({"scenario": "dense-70b-1node", "model": "llama-3.1-70b",
                                    "topology": {"name": "h100-ib-rail", "num_nodes": 1},
                                    "strategy": {"tp": 8, "batch": 16}}))
    proc = _run("shard-sim", "experiment=dense-70b-1node", f"plan={plan}", "topology=h100-ib-rail", "topology.num_nodes=2",
                f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    line = _one_error_line(proc)
    assert "device_count: tp*ep*pp*dp = 8*1*1*1 = 8 GPUs, the cluster has 16" in line
    assert "made for topology.num_nodes=1" in line and proc.stdout.strip() == ""


def test_allow_invalid_keeps_the_what_if_marked_invalid(tmp_path):
    out = tmp_path / "run"
    proc = _run("shard-sim", *OVER_HBM, "sim.allow_invalid=true", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "INVALID (hbm_capacity) what-if: dense-70b-1node" in " ".join(proc.stdout.split())
    row = next(line for line in proc.stdout.splitlines() if "tokens/s/GPU" in line)
    assert row.count("INVALID") == 2  # the proxy's and the simulator's cell
    assert "memory per GPU" in proc.stdout and "OVER" in proc.stdout
    result = json.loads((out / "result.json").read_text())
    assert result["valid"] is False and result["invalid_reason"] == "hbm_capacity"
    memory = result["memory"]
    assert memory["fits"] is False and memory["headroom_bytes"] < 0
    parts = ("weights_bytes", "kv_cache_bytes", "activations_bytes", "workspace_bytes")
    assert sum(memory[p] for p in parts) == pytest.approx(memory["total_bytes"])
    assert memory["capacity_bytes"] - memory["total_bytes"] == pytest.approx(memory["headroom_bytes"])


def test_a_valid_run_shows_its_memory(tmp_path):
    out = tmp_path / "run"
    proc = _run("shard-sim", "experiment=dense-70b-1node", "strategy.tp=8", "strategy.batch=16",
                f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "memory per GPU" in proc.stdout and "headroom" in proc.stdout and "INVALID" not in proc.stdout
    result = json.loads((out / "result.json").read_text())
    assert result["valid"] is True and result["invalid_reason"] == "" and result["memory"]["fits"] is True
    assert result["memory"]["gpu"] == "h100-sxm" and result["memory"]["headroom_bytes"] > 0


def test_memory_breakdown_sums_to_the_memory_model_and_decides_hbm_capacity():
    ctx: CostContext = scenario_context("dense-70b-1node")
    plans = [Strategy.from_dict(d) for d in ({"tp": 8, "batch": 16}, {"tp": 1, "dp": 8, "batch": 64},
                                             {"tp": 2, "pp": 4, "batch": 32, "microbatches": 4})]
    model = memory_per_gpu_bytes(ctx, StrategyArrays.from_strategies(plans))
    for plan, total in zip(plans, model, strict=True):
        m = memory_breakdown(ctx, plan)
        assert m.weights_bytes > 0 and m.kv_cache_bytes > 0 and m.activations_bytes > 0
        assert m.total_bytes - m.workspace_bytes == pytest.approx(float(total), rel=1e-12)
        assert m.workspace_bytes == ctx.cluster.gpu.hbm_reserved_bytes
        assert (m.headroom_bytes < 0) == ("hbm_capacity" in evaluate(ctx, plan).reasons)


def test_small_search_candidates_carry_validity_and_no_throughput_for_invalid_rows(tmp_path):
    out = tmp_path / "run"
    proc = _run("shard-search", "experiment=dense-70b-1node", "planner=random", "planner.budget=40",
                "planner.reranker=proxy", "planner.reference_lines=false", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with open(out / "candidates.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {"valid", "invalid_reason", "tokens_per_s_per_gpu"} <= set(rows[0])
    invalid = [r for r in rows if r["valid"] == "0"]
    valid = [r for r in rows if r["valid"] == "1"]
    assert invalid and valid
    assert all(r["tokens_per_s_per_gpu"] == "" and r["invalid_reason"] for r in invalid)
    assert all(r["tokens_per_s_per_gpu"] and r["invalid_reason"] == "" for r in valid)
    best = max(float(r["tokens_per_s_per_gpu"]) for r in valid)  # sorting the column never puts an invalid first
    summary = json.loads((out / "summary.json").read_text())
    assert summary["proxy_tokens_per_s_per_gpu"] == pytest.approx(best, rel=1e-5)
    assert "invalid_reason" in proc.stdout and "valid" in proc.stdout


class _Verdict:
    def __init__(self, value: float, reasons: list[str]):
        self.tokens_per_s_per_gpu, self.valid, self.reasons = value, not reasons, reasons


def test_rerank_never_ranks_an_invalid_plan_and_the_table_shows_no_throughput():
    from rich.console import Console

    from planner.apps.outputs import rerank_table

    plans = [Strategy.from_dict({"tp": 8, "batch": b}) for b in (16, 32, 64)]
    verdicts = {16: _Verdict(100.0, []), 32: _Verdict(900.0, ["tpot_slo"]), 64: _Verdict(50.0, [])}
    ranked = rerank([(p, 10.0 * i) for i, p in enumerate(plans, 1)], lambda s: verdicts[s.batch])
    assert [(r.strategy.batch, r.rank, r.valid) for r in ranked] == [(16, 1, True), (64, 2, True), (32, 0, False)]
    assert best_valid(ranked).strategy.batch == 16
    assert best_valid([r for r in ranked if not r.valid]) is None
    console = Console(width=250, record=True)
    console.print(rerank_table(ranked, ("qkv",), "sim", "t"))
    row = next(line for line in console.export_text().splitlines() if "tpot_slo" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1] == "-" and cells[8] == "" and cells[9] == "" and cells[10] == "no"
    assert not np.isnan(ranked[0].tokens_per_s_per_gpu)
