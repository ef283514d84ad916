"""Rewrites study: when does trading an all-reduce for all-gathers pay (the paper's appendix B)?

``python -m validation.studies.rewrites [--quick] [--out DIR] [--scenarios a,b]`` or
``shard-validate study=rewrites``. For each scenario it takes three kinds of plan: the Megatron
heuristic's best (:func:`planner.megatron.megatron_search`), the planner's best (the exact optimum
under the proxy, :func:`planner.exact.exact_optimum`, which the PPO planner can at best match) and,
because both often pick ``tp = 1`` where no all-reduce exists, the best Megatron plan at ``tp = 8``
(for MoE models also the best with ``ep > 1``, where FFN2's sharding sets the all-to-all's size) plus
a ``tp = 8`` plan stretched to ``tp = 16`` (its TP group spans two nodes). On each plan it enumerates
the all-reduce <-> all-gather rewrites (:mod:`.rewrites_enum`) and prices base and rewrite with the
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
import dataclasses
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from simcore.lowering import CostContext
from simcore.strategy import Strategy

from .rewrites_enum import Rewrite, enumerate_rewrites, phase_of
from .rewrites_terms import changed_terms

__all__ = ["DEFAULT_SCENARIOS", "FULL_SCENARIOS", "TOPOLOGIES", "Grid", "base_plans", "fit_plan", "run", "main"]

DEFAULT_SCENARIOS = ("dense-70b-1node", "dense-70b-prefill", "mixtral-2node", "deepseek-8node")
FULL_SCENARIOS = DEFAULT_SCENARIOS + ("gptmoe-1.6t-16k",)
#: name -> keyword arguments of ``topologies.build_topology``
TOPOLOGIES = {"hgx-h100": {}, "h100-ib-rail": {}, "h100-ib-fattree": {"oversubscription": 4.0}, "gb200-nvl72": {}}
_FIXED_GPUS = {"hgx-h100": 8, "gb200-nvl72": 72}
_NODE_GPUS = 8


@dataclass(frozen=True)
class Grid:
    """The settings swept per plan: context lengths (tokens), sequences (decode) or prompts (prefill)
    per attention group and microbatch, and topologies."""

    contexts: tuple[int, ...] = (1024, 4096, 16384)
    decode_seqs: tuple[int, ...] = (1, 4, 16, 64, 256)
    prefill_seqs: tuple[int, ...] = (1, 2, 4, 8)
    topologies: tuple[str, ...] = tuple(TOPOLOGIES)

    def __post_init__(self) -> None:
        for name in ("contexts", "decode_seqs", "prefill_seqs"):
            if not getattr(self, name) or any(int(v) < 1 for v in getattr(self, name)):
                raise ValueError(f"grid.{name} must hold positive integers, got {getattr(self, name)!r}")
        bad = [t for t in self.topologies if t not in TOPOLOGIES]
        if bad or not self.topologies:
            raise ValueError(f"grid.topologies: {bad or '()'} not among {', '.join(TOPOLOGIES)}")

    @classmethod
    def quick(cls) -> Grid:
        return cls(contexts=(4096,), decode_seqs=(1, 16, 256), prefill_seqs=(1, 4))


def base_plans(ctx: CostContext) -> dict[str, tuple[Strategy, str]]:
    """Label -> (plan, where it comes from); identical plans are listed once, under the first label."""
    from planner.exact import exact_optimum
    from planner.megatron import megatron_search, strategy_from_key
    from planner.space import SearchSpace

    space = SearchSpace.for_context(ctx)
    ranked = megatron_search(ctx, space)
    plans = {"megatron": (ranked.strategy(0), "Megatron heuristic's best (planner.megatron)")}
    exact = exact_optimum(ctx, space)
    if exact.key is not None:
        plans["planner"] = (strategy_from_key(exact.key), "exact optimum under the proxy (planner.exact)")
    keys, valid = ranked.keys[ranked.order], ranked.result.valid[ranked.order]
    tp8 = np.flatnonzero((keys[:, 0] == 8) & valid)
    if len(tp8):
        plans["megatron-tp8"] = (strategy_from_key(keys[tp8[0]]), "best Megatron plan at tp=8")
    tp8_ep = np.flatnonzero((keys[:, 0] == 8) & (keys[:, 1] > 1) & valid)
    if len(tp8_ep):
        plans["megatron-tp8-ep"] = (strategy_from_key(keys[tp8_ep[0]]), "best Megatron plan at tp=8 with ep>1")
    with_tp8 = [s for s, _ in plans.values() if s.tp == 8]
    if with_tp8:
        plans["megatron-tp16"] = (with_tp8[0].replace(tp=16, dp=1), "the tp=8 plan at tp=16 (TP spans two nodes)")
    unique: dict[str, tuple[Strategy, str]] = {}
    for label, (s, note) in plans.items():
        if all(s.key() != t.key() for t, _ in unique.values()):
            unique[label] = (s, note)
    return unique


def _halvings(v: int) -> list[int]:
    return [v >> i for i in range(v.bit_length()) if (v >> i) << i == v]


def fit_plan(s: Strategy, num_gpus: int, num_experts: int = 0,
             fits: Callable[[Strategy], bool] | None = None) -> tuple[Strategy, str]:
    """``s`` on a cluster of ``num_gpus``: ``dp`` fills it; if the replica does not divide it, the
    nearest degrees that do (``tp`` and ``pp`` halved, ``ep`` any count up to the experts; changing tp
    costs most, then pp, then ep), the nearest that ``fits`` (e.g. in HBM) when any does. The note
    says what changed ("" when nothing did)."""
    replica = s.tp * s.ep * s.pp
    if num_gpus % replica == 0:
        return s.replace(dp=num_gpus // replica), ""
    cands = []
    for tp in _halvings(s.tp):
        for pp in _halvings(s.pp):
            for ep in range(1, max(1, min(num_experts, num_gpus)) + 1):
                if num_gpus % (tp * ep * pp) == 0:
                    cost = 3 * math.log2(s.tp / tp) + 2 * math.log2(s.pp / pp) + abs(math.log2(s.ep / ep))
                    cands.append((cost, -tp * ep * pp, tp, ep, pp))
    fitted = []
    for *_, tp, ep, pp in sorted(cands):
        mb = s.microbatches if pp > 1 else 1
        batch = max(1, round(s.batch / (ep * mb))) * ep * mb  # divisible by ep * microbatches
        fitted.append(s.replace(tp=tp, ep=ep, pp=pp, dp=num_gpus // (tp * ep * pp), microbatches=mb, batch=batch))
    best = next((f for f in fitted if fits is None or fits(f)), fitted[0])
    return best, (f"tp{s.tp} ep{s.ep} pp{s.pp} does not divide {num_gpus} GPUs: "
                  f"nearest valid tp{best.tp} ep{best.ep} pp{best.pp}")


@cache
def _graph(topology: str, nodes: int):
    from topologies import build_topology

    kwargs = dict(TOPOLOGIES[topology])
    if topology not in _FIXED_GPUS:
        kwargs["num_nodes"] = nodes
    return build_topology(topology, **kwargs)


def topology_for(topology: str, s: Strategy):
    """The graph a plan runs on: the fixed presets as they are, IB fabrics sized to one replica."""
    nodes = max(1, math.ceil(s.tp * s.ep * s.pp / _NODE_GPUS))
    return _graph(topology, 1 if topology in _FIXED_GPUS else nodes)


def _context(scenario: str, graph, context: int) -> CostContext:
    from simcore.cluster import Cluster
    from validation.scenarios import scenario_context

    base = scenario_context(scenario)
    w = dataclasses.replace(base.workload, input_len=int(context), ttft_slo_s=None, tpot_slo_s=None)
    return CostContext(base.model, w, Cluster.from_graph(graph), base.collective_constants)


def _evaluate(ctx: CostContext, graph, s: Strategy) -> dict:
    """Proxy, simulator (contention + overlap) and simulator (overlap only) of one plan."""
    from simcore.engine import EngineConfig, simulate
    from simcore.proxy import evaluate

    proxy = evaluate(ctx, s)
    if not proxy.valid:
        return {"proxy": proxy, "reason": ", ".join(proxy.reasons)}
    full = simulate(ctx, graph, s, EngineConfig())
    overlap = simulate(ctx, graph, s, EngineConfig(contention=False))
    return {"proxy": proxy, "sim": full, "overlap": overlap, "reason": ""}


def _case(ctx: CostContext, base: Strategy, rw: Rewrite, b: dict, v: dict) -> dict:
    row = {"rewrite": rw.label, "direction": rw.direction}
    if b["reason"] or v["reason"]:
        return row | {"skipped_reason": f"base: {b['reason']}" if b["reason"] else f"rewrite: {v['reason']}"}
    pb, pv = b["proxy"], v["proxy"]
    terms = changed_terms(ctx, base, rw.apply(base), phase_of(ctx))
    d_proxy = pv.step_time_s - pb.step_time_s
    d_overlap_run = v["overlap"].step_time_s - b["overlap"].step_time_s
    d_sim = v["sim"].step_time_s - b["sim"].step_time_s
    d_compute = pv.by_category.get("compute", 0.0) - pb.by_category.get("compute", 0.0)
    us = 1e6
    return row | {
        "proxy_base_tps": pb.tokens_per_s_per_gpu, "proxy_rewrite_tps": pv.tokens_per_s_per_gpu,
        "sim_base_tps": b["sim"].tokens_per_s_per_gpu, "sim_rewrite_tps": v["sim"].tokens_per_s_per_gpu,
        "proxy_ratio": pv.tokens_per_s_per_gpu / pb.tokens_per_s_per_gpu,
        "overlap_ratio": v["overlap"].tokens_per_s_per_gpu / b["overlap"].tokens_per_s_per_gpu,
        "sim_ratio": v["sim"].tokens_per_s_per_gpu / b["sim"].tokens_per_s_per_gpu,
        "all_reduce_bytes": terms.all_reduce_bytes, "base_bytes": terms.base_bytes,
        "rewrite_bytes": terms.rewrite_bytes, "base_launches": terms.base_launches,
        "rewrite_launches": terms.rewrite_launches, "base_alpha_us": terms.base_alpha_s * us,
        "rewrite_alpha_us": terms.rewrite_alpha_s * us, "base_beta_us": terms.base_beta_s * us,
        "rewrite_beta_us": terms.rewrite_beta_s * us, "d_alpha_us": terms.d_alpha_s * us,
        "d_beta_us": terms.d_beta_s * us, "d_compute_us": d_compute * us,
        "d_other_us": (d_proxy - terms.d_alpha_s - terms.d_beta_s - d_compute) * us,
        "d_overlap_us": (d_overlap_run - d_proxy) * us, "d_contention_us": (d_sim - d_overlap_run) * us,
        "d_step_proxy_us": d_proxy * us, "d_step_sim_us": d_sim * us, "skipped_reason": "",
    }


def _sharding_note(s: Strategy, model) -> str:
    """Where a plan's sharding departs from Megatron's on the model's operators (``megatron`` if nowhere)."""
    from simcore.opgraph import op_applies
    from simcore.strategy import megatron_sharding

    meg = megatron_sharding()
    diff = [f"{op}={c}" for op, c in s.sharding.items() if c != meg[op] and op_applies(model, op)]
    return " ".join(diff) or "megatron"


def _job(scenario: str, label: str, plan: Strategy, topology: str, grid: Grid) -> tuple[list[dict], dict]:
    """Every case of one (scenario, plan, topology); also what the plan became there."""
    from simcore.lowering import StrategyArrays
    from simcore.memory import reason_names, structural_reasons
    from simcore.proxy import evaluate
    from validation.scenarios import scenario_context

    model = scenario_context(scenario).model
    graph0 = topology_for(topology, plan)
    prefill = scenario_context(scenario).workload.phase == "prefill"
    smallest = min(grid.prefill_seqs if prefill else grid.decode_seqs)

    def fits(s: Strategy) -> bool:  # the smallest setting of the grid fits in HBM
        ctx = _context(scenario, graph0, min(grid.contexts))
        return "hbm_capacity" not in evaluate(ctx, s.replace(batch=smallest * s.ep * s.microbatches)).reasons

    fitted, note = fit_plan(plan, int(graph0.graph["num_gpus"]), model.num_experts, fits)
    graph = topology_for(topology, fitted)
    ctx0 = _context(scenario, graph, scenario_context(scenario).workload.input_len)
    rewrites = enumerate_rewrites(ctx0, fitted)
    structural = reason_names(int(structural_reasons(ctx0, StrategyArrays.from_strategies([fitted]))[0]))
    info = {"degrees": f"tp{fitted.tp} ep{fitted.ep} pp{fitted.pp} dp{fitted.dp}", "fit_note": note,
            "invalid": structural, "rewrites": [dataclasses.asdict(r) for r in rewrites]}
    rows = []
    for context in grid.contexts:
        ctx = _context(scenario, graph, context)
        for seqs in grid.prefill_seqs if prefill else grid.decode_seqs:
            base = fitted.replace(batch=seqs * fitted.ep * fitted.microbatches)
            common = {"scenario": scenario, "plan": label, "base_sharding": _sharding_note(base, model),
                      "topology": topology, "fit_note": note,
                      "phase": ctx.workload.phase, "context": context, "seqs": seqs, "batch": base.batch,
                      "tp": base.tp, "ep": base.ep, "pp": base.pp, "dp": base.dp, "microbatches": base.microbatches}
            b = _evaluate(ctx, graph, base) if rewrites else None
            for rw in rewrites:
                v = _evaluate(ctx, graph, rw.apply(base)) if not b["reason"] else {"reason": ""}
                rows.append(common | _case(ctx, base, rw, b, v))
    return rows, info


def run(out_dir: str | Path, scenarios: tuple[str, ...] | list[str] | None = None, quick: bool = False,
        grid: Grid | None = None, workers: int | None = None, plan_labels: tuple[str, ...] | None = None) -> dict:
    """Run the study, write ``summary.json``, ``report.md``, ``crossover.png`` and ``cases.csv``.

    ``workers`` processes run the (scenario, plan, topology) jobs (default: the CPUs, at most 8); the
    results do not depend on it. ``plan_labels`` keeps only those base plans (see :func:`base_plans`)."""
    from validation.scenarios import scenario_context

    from .rewrites_report import write_outputs

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
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_job, *zip(*jobs, strict=True)))
    else:
        results = [_job(*job) for job in jobs]
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
    from .rewrites_report import headline, print_summary

    print_summary(summary)
    print(json.dumps(headline(summary), default=str))
    return summary


if __name__ == "__main__":
    main()
