"""Every candidate plan of a case on a fabric, at each load, under the proxy and under the simulator.

The proxy is the serving simulation with no topology graph: each step's collectives and each KV hand-off
take their idle-fabric time (contention off; the roofline's view of the network). The simulator is the
same simulation on the fabric's graph: collectives whose links are shared and KV hand-offs run as flows
contending with each other (:mod:`simcore.serving`). A plan's goodput is its output tokens/s per GPU when
both mean latencies meet the case's SLOs, else 0. Each evaluator picks the plan of highest goodput
(throughput breaks ties: where no plan meets the SLOs, the fastest); both picks are then judged by the
simulator, and the **regret** of trusting the proxy is ``1 - sim(proxy's pick) / sim(simulator's pick)``.
"""

from __future__ import annotations

import dataclasses
import math
import time

from planner.api import scenario
from planner.serving.config import build_serving_config
from planner.serving.evaluator import slo_miss
from planner.serving.space import ServingSpace
from simcore.serving import ServingResult, simulate_serving
from validation.studies.fabric.cases import Case, Fabric

__all__ = ["candidate_plans", "evaluate_case", "pick", "scenario_of"]


def scenario_of(case: Case, fabric: Fabric):
    """The composed serving scenario of ``case`` on ``fabric`` (the apps' own configs)."""
    return scenario(model=case.model, topology=fabric.topology, num_nodes=case.nodes, workload="serving",
                    overrides=[f"serving.runtime={case.runtime}", f"serving.isl={case.isl}",
                               f"serving.osl={case.osl}", *fabric.overrides])


def candidate_plans(case: Case, sc) -> list:
    """Every plan of the serving search's space at the case's degrees that uses every GPU of the cluster."""
    scfg = build_serving_config(sc.config.serving, model=sc.config.model.name)
    space = ServingSpace(sc.ctx, scfg.runtime_profile(), max_len=case.isl + case.osl, tp=list(case.tp),
                         ep=list(case.ep), pp=case.pp, max_num_seqs=case.max_num_seqs, modes=("agg", "disagg"))
    gpus = sc.ctx.cluster.num_gpus
    plans = [space.plan(k) for k in space.enumerate()]
    return [p for p in plans if p.gpus == gpus]


def _load_config(case: Case, sc, load: int):
    base = build_serving_config(sc.config.serving, model=sc.config.model.name)
    clients = load * sc.ctx.cluster.num_gpus
    requests = max(case.min_requests, math.ceil(case.requests_per_client * clients))
    return dataclasses.replace(base, concurrency=clients, num_requests=requests, ttft_slo_s=case.ttft_slo_s,
                               tpot_slo_s=case.tpot_slo_s)


def _figures(result: ServingResult, case: Case) -> dict:
    if not result.feasible:
        return {"feasible": False, "reason": result.reason, "goodput": 0.0, "tput": 0.0, "wall_s": result.wall_s}
    m = result.metrics
    ttft, tpot = m.ttft_s["mean"], m.tpot_s["mean"]
    miss = slo_miss(ttft, tpot, case.ttft_slo_s, case.tpot_slo_s)[2]
    tput = m.output_tokens_per_s_per_gpu
    out = {"feasible": True, "ttft_ms": ttft * 1e3, "tpot_ms": tpot * 1e3, "tput": tput,
           "goodput": tput if miss == 0.0 else 0.0, "wall_s": result.wall_s}
    network = getattr(result, "network", None)
    if network:
        out["network"] = network
    return out


def evaluate_case(case: Case, fabric: Fabric, loads, proxy_memo: dict, log=print) -> list[dict]:
    """One row per (load, plan): the plan's figures under the proxy and under the simulator. ``proxy_memo``
    keeps proxy results across fabrics whose cost context is the same (oversubscription is invisible to it)."""
    sc = scenario_of(case, fabric)
    plans = candidate_plans(case, sc)
    rows = []
    for load in loads:
        cfg = _load_config(case, sc, load)
        for plan in plans:
            key = (repr(sc.ctx.cluster), plan.describe(), load)
            if key not in proxy_memo:
                proxy_memo[key] = _figures(simulate_serving(sc.ctx, plan, cfg), case)
            started = time.perf_counter()
            sim = _figures(simulate_serving(sc.ctx, plan, cfg, graph=sc.graph), case)
            rows.append({"case": case.name, "fabric": fabric.name, "load": load, "clients": cfg.concurrency,
                         "requests": cfg.num_requests, "plan": plan.describe(), "mode": plan.mode,
                         "proxy": proxy_memo[key], "sim": sim})
            log(f"  {case.name:22s} {fabric.name:12s} load {load:3d}  {plan.describe():58s} proxy "
                f"{proxy_memo[key]['goodput']:7.1f}  sim {sim['goodput']:7.1f} tok/s/GPU  "
                f"({time.perf_counter() - started:.1f} s)")
    return rows


def _rank(fig: dict) -> tuple[float, float]:
    return (fig["goodput"], fig["tput"])


def pick(rows: list[dict]) -> dict:
    """For the rows of one (case, fabric, load): each evaluator's pick, both judged by the simulator."""
    by_proxy = max(rows, key=lambda r: _rank(r["proxy"]))
    by_sim = max(rows, key=lambda r: _rank(r["sim"]))
    best = by_sim["sim"]["goodput"]
    got = by_proxy["sim"]["goodput"]
    regret = 1.0 - got / best if best > 0 else 0.0
    out = {"case": rows[0]["case"], "fabric": rows[0]["fabric"], "load": rows[0]["load"],
           "proxy_pick": by_proxy["plan"], "sim_pick": by_sim["plan"], "proxy_pick_sim_goodput": got,
           "sim_pick_sim_goodput": best, "proxy_pick_proxy_goodput": by_proxy["proxy"]["goodput"],
           "regret": regret, "gain_over_proxy_pick": best / got - 1.0 if got > 0 else (math.inf if best > 0 else 0.0)}
    for key, row in (("binding", by_sim), ("proxy_pick_binding", by_proxy)):  # the links each pick waits on
        network = row["sim"].get("network")
        if network:
            out[key] = {k: network.get(k) for k in ("busiest_link", "busiest_utilization", "network_wait_share",
                                                    "flows")}
    return out
