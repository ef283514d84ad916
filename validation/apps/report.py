"""``shard-report DIR``: gather every search job under DIR (a run or multirun dir) into one table.

Per job: scenario, topology, model, GPUs (nodes x GPUs per node), best plan, proxy and simulator
throughput, ratio to Megatron (the job's own figure, else computed from its config), search time.
Writes ``report.csv``, ``throughput.png`` (topology x model) and ``search_curves.png`` (when some job
recorded a curve) into ``out`` (default: DIR) and prints a rich table. Failed or unfinished jobs are
listed with their error, never fatal; a directory with no jobs at all is an error (exit code 2). The
table names a sweep's jobs by number and the overrides that differ between them (``report.csv`` keeps
the full names).
"""

from __future__ import annotations

import csv
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from rich.markup import escape
from rich.table import Table

from planner.apps.common import (
    UserError,
    atomic_write_text,
    check_known_keys,
    cli_errors,
    config_errors_exit_2,
    console,
)
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


_OVERRIDE_SEP = re.compile(r",(?=[\w.+~/@-]+=)")  # between Hydra's "key=value" items of a job dir name


def short_names(names: list[str]) -> list[str]:
    """Sweep job dir names (``N_k=v,k=v``) without the overrides every job shares."""
    split = [name.split("/")[-1].partition("_") for name in names]
    if len(names) < 2 or any(not num.isdigit() or not sep for num, sep, _ in split):
        return names
    items = [_OVERRIDE_SEP.split(rest) for _, _, rest in split]
    common = set(items[0]).intersection(*items[1:])
    out = []
    for name, (num, _, _), its in zip(names, split, items, strict=True):
        prefix = name[: len(name) - len(name.split("/")[-1])]
        out.append(prefix + num + ("_" + ",".join(i for i in its if i not in common) if set(its) - common else ""))
    return out if len(set(out)) == len(out) else names


def _gpus(job: Job) -> str:
    if job.gpus is None:
        return "-"
    return f"{job.gpus} ({job.num_nodes}x{job.gpus_per_node})" if job.num_nodes and job.gpus_per_node else str(job.gpus)


def _table(jobs: list[Job], root: Path) -> Table:
    """One row per job; a column whose value every job shares (scenario, planner) moves into the title."""
    shared = {col: getattr(jobs[0], col) for col in ("scenario", "planner")
              if len(jobs) > 1 and len({getattr(j, col) for j in jobs}) == 1}
    title = ", ".join(f"{col} {value}" for col, value in shared.items())
    table = Table(title=f"{len(jobs)} job(s) under {root}{': ' + title if title else ''} "
                        "(throughput: best plan, tokens/s/GPU; GPUs: nodes x per node)")
    columns = [col for col in ("job", "status", "scenario", "topology", "model", "GPUs", "planner", "plan", "proxy",
                               "sim", "x Megatron", "search s") if col not in shared]
    for col in columns:
        right = col in ("GPUs", "proxy", "sim", "x Megatron", "search s")
        table.add_column(col, justify="right" if right else "left", overflow="fold",
                         no_wrap=col not in ("job", "plan"))  # long names wrap, figures never do
    for j, name in zip(jobs, short_names([j.name for j in jobs]), strict=True):
        cells = {"job": escape(name.replace(",", ", ")), "status": j.status if j.ok else f"[red]{j.status}[/red]",
                 "scenario": j.scenario or "-", "topology": j.topology or "-", "model": j.model or "-",
                 "GPUs": _gpus(j), "planner": j.planner or "-", "plan": j.plan or "-", "proxy": _fmt(j.proxy),
                 "sim": _fmt(j.sim), "x Megatron": _fmt(j.ratio, ".3f"), "search s": _fmt(j.search_s, ".2f")}
        table.add_row(*(cells[col] for col in columns))
    return table


def _failures(jobs: list[Job]) -> Table | None:
    bad = [j for j in jobs if not j.ok]
    if not bad:
        return None
    table = Table(title=f"{len(bad)} failed, unfinished or without a valid plan")
    table.add_column("job")
    table.add_column("status")
    table.add_column("error", overflow="fold")
    names = dict(zip((j.name for j in jobs), short_names([j.name for j in jobs]), strict=True))
    for j in bad:
        table.add_row(escape(names[j.name]), j.status, escape(j.error) or "-")
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
        raise UserError(f"dir: {root} is a file, not a run directory" if root.exists() else
                        f"dir: no such directory {root}")
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
    check_known_keys(cfg, ReportAppConfig)
    run(cfg)


@config_errors_exit_2
def main() -> None:
    """Accept ``shard-report DIR`` as well as ``shard-report dir=DIR``."""
    args = sys.argv[1:]
    if args and "=" not in args[0] and not args[0].startswith("-"):
        sys.argv = [sys.argv[0], f"dir={args[0]}", *args[1:]]
    _main()
