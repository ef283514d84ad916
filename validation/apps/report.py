"""``shard-report DIR``: gather every search job under DIR (a run or multirun dir) into one table.

Per job: scenario, topology, model, best plan, proxy and simulator throughput, ratio to Megatron (the
job's own figure, else computed from its config), search time. Writes ``report.csv``,
``throughput.png`` (topology x model) and ``search_curves.png`` (when some job recorded a curve) into
``out`` (default: DIR) and prints a rich table. Failed or unfinished jobs are listed with their
error, never fatal; a directory with no jobs at all is an error (exit code 2).
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from rich.table import Table

from simcore.apps.common import UserError, atomic_write_text, cli_errors, console
from validation.report import CSV_COLUMNS, Job, collect, curves_plot, fill_megatron, fill_sim, throughput_plot

__all__ = ["run", "main", "ReportAppConfig"]


@dataclass
class ReportAppConfig:
    """``dir``: the run or multirun directory; ``out``: where the report goes (default ``dir``);
    ``megatron`` / ``simulate``: compute the Megatron baseline / the simulator's throughput of the
    best plan for jobs that recorded none."""

    dir: str | None = None
    out: str | None = None
    megatron: bool = True
    simulate: bool = True


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)


def _table(jobs: list[Job], root: Path) -> Table:
    table = Table(title=f"{len(jobs)} job(s) under {root} (throughput: best plan, tokens/s/GPU)")
    for col in ("job", "status", "scenario", "topology", "model", "GPUs", "planner", "plan", "proxy", "sim",
                "x Megatron", "search s"):
        right = col in ("GPUs", "proxy", "sim", "x Megatron", "search s")
        table.add_column(col, justify="right" if right else "left", overflow="fold")
    for j in jobs:
        status = j.status if j.ok else f"[red]{j.status}[/red]"
        table.add_row(j.name, status, j.scenario or "-", j.topology or "-", j.model or "-", str(j.gpus or "-"),
                      j.planner or "-", j.plan or "-", _fmt(j.proxy), _fmt(j.sim), _fmt(j.ratio, ".3f"),
                      _fmt(j.search_s, ".2f"))
    return table


def _failures(jobs: list[Job]) -> Table | None:
    bad = [j for j in jobs if not j.ok]
    if not bad:
        return None
    table = Table(title=f"{len(bad)} failed, unfinished or without a valid plan")
    table.add_column("job")
    table.add_column("status")
    table.add_column("error", overflow="fold")
    for j in bad:
        table.add_row(j.name, j.status, j.error or "-")
    return table


def _write_csv(jobs: list[Job], path: Path) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows(j.row() for j in jobs)
    atomic_write_text(path, buf.getvalue())


def run(cfg: DictConfig) -> list[dict]:
    """Read the jobs, compute missing baselines, write CSV and PNGs, print the tables; the CSV rows."""
    if not cfg.dir:
        raise UserError("dir: give the run or multirun directory (shard-report DIR)")
    root = Path(cfg.dir)
    if not root.is_dir():
        raise UserError(f"dir: no such directory {root}")
    jobs = collect(root)
    if not jobs:
        raise UserError(f"dir: no jobs found under {root} (no .hydra/, results.json or summary.json)")
    if cfg.get("megatron", True):
        fill_megatron(jobs)
    if cfg.get("simulate", True):
        fill_sim(jobs)
    out = Path(cfg.out) if cfg.get("out") else root
    out.mkdir(parents=True, exist_ok=True)
    con = console()
    con.print(_table(jobs, root))
    failures = _failures(jobs)
    if failures is not None:
        con.print(failures)
    _write_csv(jobs, out / "report.csv")
    written = [out / "report.csv"]
    for name, plot, missing in (("throughput.png", throughput_plot, "no job finished with a throughput"),
                                ("search_curves.png", curves_plot, "no job recorded a search curve "
                                 "(search_curve, metrics.jsonl or candidates.csv)")):
        path = plot(jobs, out / name)
        if path is None:
            con.print(f"{name} skipped: {missing}")
        else:
            written.append(path)
    ok = sum(j.ok for j in jobs)
    print(f"{ok}/{len(jobs)} job(s) ok; wrote {', '.join(p.name for p in written)}; report dir: {out}")
    return [j.row() for j in jobs]


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
