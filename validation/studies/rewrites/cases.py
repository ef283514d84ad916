"""One job of the rewrites study: every case of a (scenario, plan, topology), each base plan and
rewrite priced by the proxy, the simulator (contention and overlap on) and the simulator (overlap only)."""

from __future__ import annotations

import dataclasses

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import reason_names, structural_reasons
from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, simulate
from simcore.strategy.opgraph import op_applies
from simcore.strategy.sharding import Strategy, megatron_sharding
from validation.studies.common.scenarios import scenario_context
from validation.studies.rewrites.candidates import Rewrite, enumerate_rewrites, phase_of
from validation.studies.rewrites.plans import Grid, fit_plan, topology_for
from validation.studies.rewrites.terms import changed_terms

__all__ = ["run_job"]


def _context(scenario: str, graph, context: int) -> CostContext:
    base = scenario_context(scenario)
    w = dataclasses.replace(base.workload, input_len=int(context), ttft_slo_s=None, tpot_slo_s=None)
    return CostContext(base.model, w, Cluster.from_graph(graph), base.collective_constants)


def _evaluate(ctx: CostContext, graph, s: Strategy) -> dict:
    """Proxy, simulator (contention + overlap) and simulator (overlap only) of one plan."""
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
    meg = megatron_sharding()
    diff = [f"{op}={c}" for op, c in s.sharding.items() if c != meg[op] and op_applies(model, op)]
    return " ".join(diff) or "megatron"


def run_job(scenario: str, label: str, plan: Strategy, topology: str, grid: Grid) -> tuple[list[dict], dict]:
    """Every case of one (scenario, plan, topology); also what the plan became there."""
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
