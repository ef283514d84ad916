"""Shared fixtures: small cost contexts built without topology graphs; a CSV of rows (``from conftest import write_rows``);
a serving search replayed by shard-sim (``from conftest import search_then_replay``)."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.workload import Workload


def make_ctx(model: str = "llama-3.1-70b", gpus: int = 8, phase: str = "decode", precision: str = "bf16",
             input_len: int = 2048, output_len: int = 128, gpu: str = "h100-sxm", **slo) -> CostContext:
    return CostContext(get_model(model), Workload(phase, precision, input_len, output_len, **slo),
                       Cluster.simple(gpu, gpus))


@pytest.fixture
def ctx_factory():
    return make_ctx


def write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a CSV with the first row's keys as its header; returns ``path``."""
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)


APP_ENTRY = {"search": "from planner.apps.search import main; main()", "sim": "from planner.apps.sim import main; main()"}


def run_app(name: str, *args, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``shard-search`` or ``shard-sim`` (``name``) with ``args`` in a fresh process."""
    return subprocess.run([sys.executable, "-c", APP_ENTRY[name], *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def search_then_replay(tmp_path: Path, common: list[str], *search_args, timeout: int = 300) -> tuple[dict, Path, dict]:
    """A serving search with ``common + search_args`` into ``tmp_path/search``, then shard-sim of its
    ``best_plan.yaml`` with ``common`` into ``tmp_path/sim``; both must exit 0 and the replay must price the
    plan as the search did. Returns the plan's ``serving_plan``, the search's run dir and the replay's result."""
    import yaml

    out = tmp_path / "search"
    proc = run_app("search", *common, *search_args, f"hydra.run.dir={out}", cwd=tmp_path, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    plan = yaml.safe_load((out / "best_plan.yaml").read_text())["serving_plan"]
    sim = run_app("sim", *common, f"plan={out / 'best_plan.yaml'}", f"hydra.run.dir={tmp_path / 'sim'}", cwd=tmp_path,
                  timeout=timeout)
    assert sim.returncode == 0, sim.stderr
    replay = json.loads((tmp_path / "sim" / "result.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert replay["result"]["metrics"]["output_tokens_per_s_per_gpu"] == pytest.approx(
        summary["best"]["tokens_per_s_per_gpu"], rel=1e-9)
    return plan, out, replay
