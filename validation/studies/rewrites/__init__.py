"""Rewrites study: when does trading an all-reduce for all-gathers pay (the paper's appendix B)?

``python -m validation.studies.rewrites [--quick] [--out DIR] [--scenarios a,b]`` or
``shard-validate study=rewrites``. For each scenario it takes three kinds of plan: the Megatron
heuristic's best (:func:`planner.megatron.megatron_search`), the planner's best (the exact optimum
under the proxy, :func:`planner.exact.exact_optimum`, which the PPO planner can at best match) and,
because both often pick ``tp = 1`` where no all-reduce exists, the best Megatron plan at ``tp = 8``
(for MoE models also the best with ``ep > 1``, where FFN2's sharding sets the all-to-all's size) plus
a ``tp = 8`` plan stretched to ``tp = 16`` (its TP group spans two nodes). On each plan it enumerates
the all-reduce <-> all-gather rewrites (:mod:`.candidates`) and prices base and rewrite with the
proxy and the simulator (contention and overlap on; and overlap only, so the difference splits into
what overlap and what link sharing do) over context lengths, batch sizes and four topologies.

Settings: the batch is ``seqs`` sequences (decode) or prompts (prefill) per attention group and
microbatch, the context is the KV length (decode) or prompt length (prefill), SLOs are dropped (the
comparison is at equal batch) and a case whose plan does not fit in HBM is skipped with the reason.
A plan whose GPUs do not divide a topology (8 GPUs in ``hgx-h100``, 72 in ``gb200-nvl72``) is moved
to the nearest degrees that do (:func:`fit_plan`; the case says so); IB clusters get as many 8-GPU
nodes as one replica needs.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from simcore.files import dumps
from validation.studies.common.scenarios import scenario_context
from validation.studies.rewrites.cases import run_job
from validation.studies.rewrites.plans import TOPOLOGIES, Grid, base_plans, fit_plan
from validation.studies.rewrites.report import headline, print_summary, write_outputs

__all__ = ["DEFAULT_SCENARIOS", "FULL_SCENARIOS", "TOPOLOGIES", "Grid", "base_plans", "fit_plan", "run", "main",
           "headline"]

DEFAULT_SCENARIOS = ("dense-70b-1node", "dense-70b-prefill", "mixtral-2node", "deepseek-8node")
FULL_SCENARIOS = DEFAULT_SCENARIOS + ("gptmoe-1.6t-16k",)


def run(out_dir: str | Path, scenarios: tuple[str, ...] | list[str] | None = None, quick: bool = False,
        grid: Grid | None = None, workers: int | None = None, plan_labels: tuple[str, ...] | None = None) -> dict:
    """Run the study, write ``summary.json``, ``report.md``, ``crossover.png`` and ``cases.csv``.

    ``workers`` processes run the (scenario, plan, topology) jobs (default: the CPUs, at most 8); the
    results do not depend on it. ``plan_labels`` keeps only those base plans (see :func:`base_plans`)."""
    scenarios = tuple(scenarios or (DEFAULT_SCENARIOS if quick else FULL_SCENARIOS))
    grid = grid or (Grid.quick() if quick else Grid())
    plans, jobs = {}, []
    for name in scenarios:
        found = base_plans(scenario_context(name))
        found = {k: v for k, v in found.items() if plan_labels is None or k in plan_labels}
        plans[name] = {label: {"strategy": s.to_dict(), "source": note} for label, (s, note) in found.items()}
        jobs += [(name, label, s, topo, grid) for label, (s, _) in found.items() for topo in grid.topologies]
    workers = min(8, os.cpu_count() or 1) if workers is None else int(workers)
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(run_job, *zip(*jobs, strict=True)))
    else:
        results = [run_job(*job) for job in jobs]
    rows = []
    for (name, label, _, topo, _), (job_rows, info) in zip(jobs, results, strict=True):
        plan, labels = plans[name][label], []
        for rw in info["rewrites"]:  # what each rewrite changes, once per plan (at the plan's own batch)
            labels.append(rw["label"])
            plan.setdefault("rewrites", {}).setdefault(rw["label"], {k: v for k, v in rw.items() if k != "label"})
        plan.setdefault("on", {})[topo] = info | {"rewrites": labels}
        rows += job_rows
    rows = _dedupe(rows)
    return write_outputs(Path(out_dir), rows, plans, grid, quick)


def _dedupe(rows: list[dict]) -> list[dict]:
    """A plan refitted onto the very degrees of another plan on the same topology is counted once."""
    seen, out = set(), []
    for r in rows:
        key = (r["scenario"], r["topology"], r["tp"], r["ep"], r["pp"], r["base_sharding"], r["context"],
               r["seqs"], r["rewrite"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the default scenarios on a small grid")
    parser.add_argument("--out", default="outputs/rewrites", help="output directory")
    parser.add_argument("--scenarios", default=None, help="comma-separated scenario names")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: CPUs, at most 8)")
    args = parser.parse_args(argv)
    scenarios = args.scenarios.split(",") if args.scenarios else None
    summary = run(args.out, scenarios, quick=args.quick, workers=args.workers)
    print_summary(summary)
    print(dumps(headline(summary), default=str))
    return summary
