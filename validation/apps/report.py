"""``shard-report DIR``: gather every search job under DIR (a run or multirun dir) into one table.

Writes ``report.csv`` into DIR and prints a rich table; a job without ``results.json`` is listed as
unfinished, never fatal. A directory with no jobs at all is an error (exit code 2).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from rich.table import Table

from simcore.apps.common import UserError, atomic_write_text, cli_errors, console

__all__ = ["run", "main", "collect"]

_COLUMNS = ("job", "scenario", "model", "topology", "gpus", "planner", "status", "tokens_per_s_per_gpu",
            "tp", "ep", "pp", "dp", "batch", "calls", "wall_s")


@dataclass
class ReportAppConfig:
    dir: str | None = None


def collect(root: Path) -> list[dict]:
    """One row per job directory (a directory holding ``.hydra`` or ``results.json``)."""
    jobs = sorted({p.parent for p in root.rglob(".hydra")} | {p.parent for p in root.rglob("results.json")})
    rows = []
    for job in jobs:
        row = {"job": str(job.relative_to(root)) or "."}
        path = job / "results.json"
        if not path.is_file():
            rows.append(row | {"status": "unfinished (no results.json)"})
            continue
        try:
            data = json.loads(path.read_text())
            best, cfg = data["best"], data.get("config", {})
            s = best["strategy"]
            rows.append(row | {
                "scenario": data.get("scenario"), "model": cfg.get("model", {}).get("name"),
                "topology": cfg.get("topology", {}).get("name"),
                "gpus": s["tp"] * s["ep"] * s["pp"] * s["dp"], "planner": data.get("planner"),
                "status": "ok" if best["valid"] else "no valid plan",
                "tokens_per_s_per_gpu": round(best["tokens_per_s_per_gpu"], 2),
                **{k: s[k] for k in ("tp", "ep", "pp", "dp", "batch")},
                "calls": data.get("calls"), "wall_s": round(data.get("wall_s", 0.0), 3)})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            rows.append(row | {"status": f"unreadable results.json: {exc}"})
    return rows


def run(cfg: DictConfig) -> list[dict]:
    if not cfg.dir:
        raise UserError("dir: give the run or multirun directory (shard-report DIR)")
    root = Path(cfg.dir)
    if not root.is_dir():
        raise UserError(f"dir: no such directory {root}")
    rows = collect(root)
    if not rows:
        raise UserError(f"dir: no jobs found under {root}")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_COLUMNS)
    writer.writeheader()
    writer.writerows({k: r.get(k, "") for k in _COLUMNS} for r in rows)
    atomic_write_text(root / "report.csv", buf.getvalue())
    table = Table(title=f"{len(rows)} job(s) under {root}")
    for col in _COLUMNS:
        table.add_column(col)
    for r in rows:
        table.add_row(*(str(r.get(c, "")) for c in _COLUMNS))
    console().print(table)
    print(f"report: {root / 'report.csv'}")
    return rows


ConfigStore.instance().store(name="report_schema", node=ReportAppConfig)


@hydra.main(version_base=None, config_path="pkg://conf", config_name="report")
@cli_errors
def _main(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    """Accept ``shard-report DIR`` as well as ``shard-report dir=DIR``."""
    args = sys.argv[1:]
    if args and "=" not in args[0] and not args[0].startswith("-"):
        sys.argv = [sys.argv[0], f"dir={args[0]}", *args[1:]]
    _main()
