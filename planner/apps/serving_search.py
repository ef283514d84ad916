"""``shard-search workload=serving``: the best serving plan under the SLOs, the front across loads, launches.

:func:`run_serving_search` is pure apart from its run dir: it searches with ``planner.name`` (one of
:data:`~planner.serving.methods.METHODS`) for ``serving.search.budget`` simulations, simulates the
best plans of each mode at every load of ``serving.search.loads``, and writes into the run dir:

- ``summary.json`` / ``results.json``: the answer, its metrics and goodput, the Megatron-style
  heuristic's best, the closest misses when no plan meets the SLOs, times;
- ``best_plan.yaml``: the plan (replay with ``shard-sim workload=serving plan=...``);
- ``candidates.csv``: every simulated plan; ``pareto.csv`` / ``pareto.png``: tokens/s/GPU against
  tokens/s/user across loads (every simulated plan at the configured load; the ``pareto_plans`` best
  of each mode and up to twice that many of the configured load's front at every other load), front
  marked; ``best_per_slo.csv``: the best plan per TPOT target;
- ``launch_vllm.sh``, ``launch_sglang.sh``, ``launch_trtllm.sh`` (+ ``trtllm_*.yaml``);
- ``serving_sims.pkl``: the journal of every simulation, appended as each ends
  (:mod:`planner.serving.journal`). SIGINT / SIGTERM stop the search between two simulations;
  ``+resume=RUN_DIR`` replays the journal and finishes the run, with the outputs of an uninterrupted one.

On the console: a progress bar over the budgeted simulations (the best plan meeting the SLOs so far, the
last plan simulated), then one over the front's simulations at the other loads; then the best plans, one
row per layout at its best ``max_num_seqs``, each SLO read as ``met`` or missed by how much.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from planner.apps.common import atomic_write_json, atomic_write_text, console, run_dir
from planner.apps.outputs import write_metrics
from planner.apps.serve import plan_launch, write_launch
from planner.checkpoint import StopRequest
from planner.runner import SearchInterrupted
from planner.serving.config import build_serving_config, build_serving_context
from planner.serving.evaluator import ServingEvaluator, slo_miss
from planner.serving.journal import SimJournal
from planner.serving.pareto import (
    POINT_COLUMNS,
    best_per_slo,
    closest_misses,
    mark_front,
    plot_front,
    point,
    sweep_loads,
    write_points,
)
from planner.serving.search import check_serving_planner, search_plans, serving_space
from simcore.export.serving import SERVING_TARGETS
from topologies.scenario import build_graph

__all__ = ["run_serving_search", "distinct_layouts", "slo_cell"]


def _best_per_mode(ev: ServingEvaluator, k: int):
    """The ``k`` best simulated plans of each mode (by the search objective)."""
    out = []
    for mode in ("agg", "disagg"):
        out += [r for r in ev.ranked() if r.feasible and r.plan.mode == mode][:k]
    return out


def _metrics(rec) -> dict | None:
    if rec is None:
        return None
    m = rec.result.metrics
    return {"plan": rec.plan.describe(), "mode": rec.plan.mode, "gpus": rec.plan.gpus,
            "tokens_per_s_per_gpu": m.output_tokens_per_s_per_gpu, "tokens_per_s_per_user": m.tokens_per_s_per_user,
            "ttft_ms": m.ttft_s["mean"] * 1e3, "tpot_ms": m.tpot_s["mean"] * 1e3, "goodput": m.goodput,
            "goodput_tokens_per_s_per_gpu": m.goodput_tokens_per_s_per_gpu, "requests_per_s": m.requests_per_s,
            "plan_dict": rec.plan.to_dict()}


def _layout(plan) -> str:
    """A plan's description without its ``max_num_seqs`` (the rows of the table)."""
    return re.sub(r", seqs \d+", "", plan.describe())


def distinct_layouts(ranked: list) -> list[tuple]:
    """``(record, max_num_seqs tried)`` for each layout of ``ranked`` (records best first): its best
    ``max_num_seqs``'s record and how many values it was simulated at."""
    best, tried = {}, {}
    for r in ranked:
        key = _layout(r.plan)
        best.setdefault(key, r)
        tried[key] = tried.get(key, 0) + 1
    return [(r, tried[key]) for key, r in best.items()]


def slo_cell(over: float, slo_ms) -> str:
    """One SLO of a plan: ``met``, ``+12% over`` (how far the mean is over its target), or ``-`` (no target)."""
    if slo_ms is None:
        return "-"
    if not over > 0:
        return "met"
    pct = 100 * over
    return f"+{pct:.0f}% over" if pct >= 1 else f"+{pct:.1f}% over"


def _table(title: str, rows: list[tuple], slo: dict) -> Table:
    table = Table(title=title)
    for col in ("#", "plan", "seqs", "GPUs", "tokens/s/GPU", "tokens/s/user", "TTFT ms", "TPOT ms", "goodput",
                "TTFT SLO", "TPOT SLO"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    for i, (r, tried) in enumerate(rows, 1):
        m = r.result.metrics
        seqs = r.plan.pools[-1][1].max_num_seqs
        table.add_row(str(i), _layout(r.plan), f"{seqs}" + (f" (best of {tried})" if tried > 1 else ""),
                      str(r.plan.gpus), f"{m.output_tokens_per_s_per_gpu:,.1f}", f"{m.tokens_per_s_per_user:,.1f}",
                      f"{m.ttft_s['mean'] * 1e3:,.0f}", f"{m.tpot_s['mean'] * 1e3:,.1f}", f"{m.goodput:.2f}",
                      slo_cell(r.ttft_over, slo["ttft_ms"]), slo_cell(r.tpot_over, slo["tpot_ms"]))
    return table


class _TickingJournal(SimJournal):
    """The search's journal (:class:`SimJournal`), also calling ``tick(result)`` as each budgeted
    simulation ends: simulated and appended, or replayed from a resumed journal."""

    def __init__(self, *args, tick, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tick = tick

    def get(self, key):
        result = super().get(key)
        if result is not None:
            self.tick(result)
        return result

    def add(self, key, result) -> None:
        super().add(key, result)
        self.tick(result)


def _progress() -> Progress:
    # the counts first and never squeezed; the best and last plans cut to what the terminal leaves them
    con = console()
    note = Column(no_wrap=True, overflow="ellipsis", max_width=max(con.width - 70, 10))
    return Progress(TextColumn("{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[best]} {task.fields[last]}", table_column=note),
                    console=con)


def _ticker(progress: Progress, task, scfg):
    """``tick(result)``: advance ``task`` by one simulation, showing the best tokens/s/GPU that meets the
    SLOs so far and the plan just simulated."""
    best = [-1.0]

    def tick(result) -> None:
        m = result.metrics
        meets = m is not None and slo_miss(m.ttft_s["mean"], m.tpot_s["mean"], scfg.ttft_slo_s, scfg.tpot_slo_s)[2] == 0
        if meets:
            best[0] = max(best[0], m.output_tokens_per_s_per_gpu)
        last = f"last {result.plan.describe()}: " + (f"{m.output_tokens_per_s_per_gpu:,.1f} tok/s/GPU" if m else
                                                     "cannot run")
        progress.update(task, advance=1, last=last,
                        best="best: none meets the SLOs yet" if best[0] < 0 else
                        f"best {best[0]:,.1f} tok/s/GPU meeting the SLOs;")

    return tick


def _search(cfg, ctx, scfg, graph, out: Path, resume: bool, progress: Progress):
    """The journaled search (``planner.serving.journal``) under a progress bar: a stop before the budget
    is spent raises :class:`SearchInterrupted`, the journal holding every simulation made."""
    method = str(cfg.planner.name)
    config = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "resume"}
    check_serving_planner(cfg.planner)  # bad input stops here and in serving_space, before the journal is opened
    space = serving_space(ctx, scfg, cfg.serving.search, method)
    total = min(int(cfg.serving.search.budget), space.size)
    task = progress.add_task(f"{method} on {cfg.scenario}", total=total, best="", last="")
    journal = _TickingJournal(out, config, resume=resume, tick=_ticker(progress, task, scfg))
    try:
        with StopRequest() as stop:
            ev, info = search_plans(ctx, scfg, cfg.serving.search, method, int(cfg.seed), graph=graph,
                                    pcfg=cfg.planner, stop=stop, journal=journal, space=space)
            if stop() and not ev.done:  # stopped before the budget was spent: the journal holds the rest
                exc = SearchInterrupted(ev.sims, out)
                exc.signal, exc.unit = stop.signal, "simulation(s)"
                raise exc
    finally:
        journal.close()
    return ev, info


def _front_rows(ctx, scfg, search, ev: ServingEvaluator, ranked: list, graph, progress: Progress) -> list[dict]:
    """The Pareto rows: every feasible plan at the configured load, then the best plans of each mode and
    those on that load's front at every other load of ``search.loads`` (a progress bar over those)."""
    rows = mark_front([point(r.result, scfg, 1.0) for r in ranked])
    sweep = [r.plan for r in _best_per_mode(ev, int(search.pareto_plans))]
    on_front = [r.plan for r, row in zip(ranked, rows, strict=True) if row["on_front"]]
    sweep += [p for p in on_front if p not in sweep][: 2 * int(search.pareto_plans)]
    loads = [x for x in search.loads if float(x) != 1.0]
    runs = (1 if scfg.arrival == "trace" else len(loads)) * len(sweep)  # a trace is replayed once (sweep_loads)
    task = progress.add_task("the front at the other loads", total=runs, best="", last="")

    def on_point(row: dict) -> None:
        progress.update(task, advance=1, last=f"last {row['plan']} at x{row['load']:g} the load")

    rows += sweep_loads(ctx, sweep, scfg, loads, graph=graph, runtime=scfg.runtime_profile(), on_point=on_point)
    return mark_front(rows)


def _megatron_best(ev: ServingEvaluator):
    """The Megatron-style plans' best that meets the SLOs (the baseline beside the search), or ``None``."""
    keys = [tuple(int(x) for x in a) for a in ev.actions.megatron()]
    heuristic = [ev.records[k] for k in keys if k in ev.records]
    return max((r for r in heuristic if r.meets), key=lambda r: r.tokens_per_s_per_gpu, default=None)


def _summary(cfg, ctx, scfg, ev, info, best, ranked, per_slo, misses, walls: dict) -> dict:
    s, heuristic_best = cfg.serving, _megatron_best(ev)
    return {
        "scenario": cfg.scenario, "model": ctx.model.name, "gpus": ctx.cluster.num_gpus,
        "planner": str(cfg.planner.name), "seed": int(cfg.seed), "budget": ev.budget, "sims": ev.sims,
        "proposals": ev.proposals, "space_size": ev.actions.size, **walls, "sim_wall_s": ev.sim_wall_s,
        "serving": {"arrival": scfg.arrival, "concurrency": scfg.concurrency, "rate": scfg.rate, "runtime": scfg.runtime,
                    "num_requests": scfg.num_requests, "isl": s.isl, "osl": s.osl},
        "slo": {"ttft_ms": s.ttft_slo_ms, "tpot_ms": s.tpot_slo_ms}, "met": best is not None,
        "tokens_per_s_per_gpu": best.tokens_per_s_per_gpu if best else None, "best": _metrics(best),
        "best_by_mode": {m: _metrics(next((r for r in ranked if r.meets and r.plan.mode == m), None))
                         for m in ("agg", "disagg")},
        "megatron": _metrics(heuristic_best),
        "ratio_to_megatron": best.tokens_per_s_per_gpu / heuristic_best.tokens_per_s_per_gpu
        if best and heuristic_best else None,
        "closest_misses": misses, "best_per_slo": per_slo, "method_info": {k: v for k, v in info.items() if k != "metrics"},
    }


def _print_outcome(con, s, best, summary: dict) -> None:
    """The best plan against the Megatron-style one, or, where no plan meets the SLOs, the closest misses."""
    if best is not None:
        ratio = f" ({summary['ratio_to_megatron']:.3f}x the Megatron-style plan)" if summary["ratio_to_megatron"] else ""
        con.print(f"best: {best.plan.describe()}: {best.tokens_per_s_per_gpu:,.1f} tokens/s/GPU, "
                  f"goodput {best.result.metrics.goodput:.2f}{ratio}")
        return
    con.print(f"[red]no plan meets the SLOs[/red] (TTFT <= {s.ttft_slo_ms} ms, TPOT <= {s.tpot_slo_ms} ms "
              f"on the mean); closest:")
    for m in summary["closest_misses"]:
        con.print(f"  {m['plan']}: TTFT {m['ttft_ms']:,.0f} ms ({slo_cell(m['ttft_over_pct'] / 100, s.ttft_slo_ms)}), "
                  f"TPOT {m['tpot_ms']:,.1f} ms ({slo_cell(m['tpot_over_pct'] / 100, s.tpot_slo_ms)})")


def run_serving_search(cfg) -> dict:
    """Search, sweep the loads, print the tables, write every output; return the summary."""
    started = time.perf_counter()
    s, search, con = cfg.serving, cfg.serving.search, console()
    scfg, ctx = build_serving_config(s, model=cfg.model.name), build_serving_context(cfg)
    graph = build_graph(cfg.topology, cfg.hardware) if s.network else None
    resume_dir = cfg.get("resume")
    out = Path(resume_dir) if resume_dir else run_dir()
    with _progress() as progress:
        ev, info = _search(cfg, ctx, scfg, graph, out, bool(resume_dir), progress)
        search_s = time.perf_counter() - started
        ranked = [r for r in ev.ranked() if r.feasible]
        best = next((r for r in ranked if r.meets), None)
        t0 = time.perf_counter()
        rows = _front_rows(ctx, scfg, search, ev, ranked, graph, progress)
        pareto_s = time.perf_counter() - t0
    grid = sorted({float(x) for x in search.tpot_grid_ms} | ({float(s.tpot_slo_ms)} if s.tpot_slo_ms else set()))
    per_slo = best_per_slo(rows, s.ttft_slo_ms, grid)
    misses = closest_misses(ev.records.values()) if best is None else []
    load = f"{scfg.concurrency} clients" if scfg.arrival == "closed" else f"{scfg.arrival} {scfg.rate:g} req/s"
    layouts = distinct_layouts(ranked)
    con.print(_table(f"{cfg.scenario}: {ctx.model.name} on {ctx.cluster.num_gpus} x {ctx.cluster.gpu.name}, "
                     f"{scfg.runtime}, {load}, ISL {s.isl} OSL {s.osl}, SLO TTFT {s.ttft_slo_ms} ms TPOT "
                     f"{s.tpot_slo_ms} ms: {cfg.planner.name}, {ev.sims} simulated plans of {ev.actions.size} "
                     f"({len(layouts)} layouts, each at its best max_num_seqs)",
                     layouts[:10], {"ttft_ms": s.ttft_slo_ms, "tpot_ms": s.tpot_slo_ms}))
    summary = _summary(cfg, ctx, scfg, ev, info, best, ranked, per_slo, misses,
                       {"search_wall_s": search_s, "pareto_wall_s": pareto_s})
    _write(out, cfg, ctx, ev, best or (ranked[0] if ranked else None), rows, per_slo, summary, info, scfg)
    summary["total_wall_s"] = time.perf_counter() - started
    atomic_write_json(out / "summary.json", summary)
    _print_outcome(con, s, best, summary)
    con.print(f"searched in {search_s:.1f} s ({ev.sims} simulations, {ev.sim_wall_s:.1f} s simulating), "
              f"front over {len(search.loads)} loads in {pareto_s:.1f} s  ->  run dir: {out}")
    return summary


def _write(out: Path, cfg, ctx, ev, answer, rows, per_slo, summary, info, scfg) -> None:
    results = summary | {"config": OmegaConf.to_container(cfg, resolve=True),
                         "ranked": [_metrics(r) | {"meets_slo": r.meets} for r in ev.ranked() if r.feasible][:50]}
    atomic_write_json(out / "results.json", results)
    candidates = [point(r.result, scfg, 1.0) | {"order": r.index} for r in sorted(ev.records.values(),
                                                                                  key=lambda r: r.index)]
    write_points(out / "candidates.csv", candidates, ("order", *POINT_COLUMNS[3:-1]))
    write_points(out / "pareto.csv", rows)
    plot_front(out / "pareto.png", rows, f"{cfg.scenario}: {ctx.model.name}, {scfg.runtime}, loads x"
               f"{', '.join(f'{x:g}' for x in cfg.serving.search.loads)} of the configured load")
    write_points(out / "best_per_slo.csv", per_slo, tuple(per_slo[0]) if per_slo else ("tpot_slo_ms",))
    if info.get("metrics"):
        write_metrics(out / "metrics.jsonl", info["metrics"])
    if answer is None:
        return
    plan = {"scenario": cfg.scenario, "model": cfg.model.name, "topology": OmegaConf.to_container(cfg.topology),
            "serving": {k: v for k, v in OmegaConf.to_container(cfg.serving).items() if k not in ("plan", "search")},
            "meets_slo": bool(answer.meets), "serving_plan": answer.plan.to_dict()}
    atomic_write_text(out / "best_plan.yaml", yaml.safe_dump(plan, sort_keys=False))
    for target in SERVING_TARGETS:
        write_launch(out, plan_launch(answer.plan, ctx, ev.graph, scfg, target))
