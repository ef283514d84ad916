"""The fabric study (validation.studies.fabric): its candidate plans and how it judges the two picks."""

from __future__ import annotations

import pytest

from validation.studies.fabric.cases import CASES, FABRICS
from validation.studies.fabric.compare import candidate_plans, pick, scenario_of


def _row(plan: str, proxy: float, sim: float, proxy_tput: float | None = None, sim_tput: float | None = None) -> dict:
    return {"case": "c", "fabric": "f", "load": 4, "plan": plan,
            "proxy": {"goodput": proxy, "tput": proxy if proxy_tput is None else proxy_tput},
            "sim": {"goodput": sim, "tput": sim if sim_tput is None else sim_tput}}


def test_each_pick_is_judged_by_the_simulator():
    p = pick([_row("a", 100.0, 80.0), _row("b", 90.0, 88.0)])
    assert (p["proxy_pick"], p["sim_pick"]) == ("a", "b")
    assert p["regret"] == pytest.approx(1 - 80.0 / 88.0)
    assert p["gain_over_proxy_pick"] == pytest.approx(88.0 / 80.0 - 1)


def test_where_no_plan_meets_the_slos_the_fastest_is_picked():
    p = pick([_row("a", 0.0, 0.0, 50.0, 40.0), _row("b", 0.0, 0.0, 45.0, 42.0)])
    assert (p["proxy_pick"], p["sim_pick"], p["regret"], p["gain_over_proxy_pick"]) == ("a", "b", 0.0, 0.0)


def test_candidates_use_every_gpu_of_the_cluster_on_each_fabric():
    case = next(c for c in CASES if c.name == "llama-3.1-70b-4node")
    for fabric in (FABRICS[0], FABRICS[2]):
        sc = scenario_of(case, fabric)
        plans = candidate_plans(case, sc)
        assert plans and all(p.gpus == 32 for p in plans)
        assert {p.mode for p in plans} == {"agg", "disagg"}
    assert scenario_of(case, FABRICS[2]).graph.graph.get("oversubscription", 4.0) == 4.0
