"""The Python API (planner.api) gives what the apps give, on the same configs."""

from __future__ import annotations

import pytest

from planner import api
from planner.errors import UserError
from simcore.config import ConfigError


@pytest.fixture(scope="module")
def sc():
    return api.scenario("dense-70b-1node")


def test_a_scenario_is_the_experiment_the_apps_compose(sc):
    assert sc.name == "dense-70b-1node" and sc.ctx.model.name == "llama-3.1-70b"
    assert sc.ctx.cluster.num_gpus == 8 and sc.graph.graph["num_gpus"] == 8


def test_a_scenario_is_built_from_names():
    built = api.scenario(model="llama-3.1-8b", topology="hgx-h100", num_nodes=1, workload="prefill")
    assert (built.ctx.model.name, built.ctx.workload.phase, built.ctx.cluster.num_gpus) == ("llama-3.1-8b", "prefill", 8)


def test_a_serving_scenario_takes_its_lengths_from_the_serving_node():
    built = api.scenario(model="llama-3.1-8b", topology="hgx-h100", num_nodes=1, workload="serving",
                         overrides=["serving.isl=2000", "serving.osl=300"])
    assert (built.ctx.workload.input_len, built.ctx.workload.output_len) == (2000, 300)
    result = api.serve(built, {"mode": "agg", "pool": {"tp": 1}}, concurrency=2, osl=16, num_requests=4)
    assert result.feasible


def test_price_and_simulate_agree_without_contention(sc):
    plan = api.megatron_plan(sc)
    proxy = api.price(sc, plan)
    assert proxy.valid and proxy.tokens_per_s_per_gpu > 0
    sim = api.simulate(sc, plan, contention=False, overlap=False)
    assert sim.tokens_per_s_per_gpu == pytest.approx(proxy.tokens_per_s_per_gpu, rel=1e-6)


def test_strategy_takes_degrees_and_operator_choices():
    s = api.strategy(tp=4, dp=2, batch=8, qkv="dim1")
    assert (s.tp, s.dp, s.gpus, s.sharding["qkv"]) == (4, 2, 8, "dim1")
    assert s.describe() == "tp=4 ep=1 pp=1 dp=2 batch=8 mb=1"


def test_serve_simulates_a_plan_request_by_request(sc):
    result = api.serve(sc, {"mode": "agg", "pool": {"tp": 8}}, concurrency=4, osl=32, num_requests=8)
    assert result.feasible and result.metrics.tpot_s["mean"] > 0


def test_search_returns_the_best_valid_plan(sc):
    result = api.search(sc, method="random", budget=32)
    assert result.planner == "random" and result.best_key is not None and result.best_value > 0


def test_bad_input_is_a_one_line_error():
    with pytest.raises(ConfigError, match="model: unknown model"):
        api.scenario(model="/nonexistent/config.json")
    with pytest.raises(UserError, match="serving.plan.pool"):
        api.serve(api.scenario("dense-70b-1node"), {"mode": "agg", "pool": {"tpp": 8}})
