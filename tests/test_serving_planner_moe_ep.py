"""The serving planner searches expert parallelism inside tensor-parallel groups: the ``moe_ep`` heads, their
masks, plans that carry the layout into the simulation and ``best_plan.yaml``, and bad values."""

from __future__ import annotations

import pytest
from conftest import run_app, search_then_replay

from planner.serving import ServingEvaluator, ServingSpace, method_config, run_method
from planner.serving.config import plan_from_dict
from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.moe import RoutingConfig
from simcore.serving import LengthDist, ServingConfig, get_runtime
from simcore.workload import Workload

MODEL = "qwen3-30b-a3b"  # 128 experts, top 8
SAMPLED = RoutingConfig(sampled=True)  # a step waits for its busiest expert GPU


def _case(moe_ep=(1, 2, 4), modes=("agg",)):
    ctx = CostContext(get_model(MODEL), Workload(precision="fp8", input_len=512, output_len=64),
                      Cluster.simple("h100-sxm", 4), routing=SAMPLED)
    cfg = ServingConfig(concurrency=8, num_requests=16, input_len=LengthDist(mean=512), output_len=LengthDist(mean=64),
                        runtime="sglang", tpot_slo_s=0.05)
    space = ServingSpace(ctx, get_runtime("sglang"), max_len=576, tp=(1, 2, 4), ep=(1,), pp=(1,), max_num_seqs=(8,),
                         modes=modes, moe_ep=moe_ep)
    return ctx, cfg, space


def test_the_heads_exist_only_when_searched_and_plans_carry_their_layout():
    _, _, space = _case()
    assert [h.name for h in space.heads[-2:]] == ["a.moe_ep", "b.moe_ep"]
    plans = [space.plan(a) for a in space.enumerate()]
    layouts = sorted({(p.pool.strategy.tp, p.pool.moe_ep) for p in plans})
    # moe_ep divides tp: tp 1 takes 1; tp 2 takes 1, 2; tp 4 takes 1, 2, 4
    assert layouts == [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]
    for a in space.enumerate():
        assert (space.action_of(space.plan(a)) == a).all()
    assert {space.plan(a).pool.moe_ep for a in space.megatron()} == {1}  # the warm start keeps expert TP
    _, _, plain = _case(moe_ep=None)
    assert plain.heads[-1].name == "max_num_seqs" and plain.num_heads == 10
    assert {plain.plan(a).pool.moe_ep for a in plain.enumerate()} == {1}
    # worker counts 1-4 at tp 1, 1-2 at tp 2, 1 at tp 4: each tp's plans times its moe_ep values
    assert (plain.size, space.size) == (4 + 2 + 1, 4 + 2 * 2 + 1 * 3)


def test_a_disaggregated_plan_chooses_each_pools_layout():
    _, _, space = _case(modes=("agg", "disagg"))
    disagg = [space.plan(a) for a in space.enumerate() if space.plan(a).mode == "disagg"]
    assert {(p.prefill.moe_ep, p.decode.moe_ep) for p in disagg} >= {(1, 2), (2, 1)}
    agg = [a for a in space.enumerate() if space.plan(a).mode == "agg"]
    assert all(a[space.moe_head + 1] == 0 for a in agg)  # no pool b: its head takes its first value


def test_the_exact_search_prices_each_layout_and_the_answer_replays():
    ctx, cfg, space = _case()
    ev = ServingEvaluator(ctx, space, cfg, budget=space.size)
    run_method("exact", ev, method_config(), 0)
    by_layout = {(r.plan.pool.strategy.tp, r.plan.pool.moe_ep): r.tokens_per_s_per_gpu for r in ev.records.values()}
    assert len(by_layout) == 6
    # same GPUs, other expert layout: a different price, so the layout is a real choice
    assert by_layout[(4, 4)] != by_layout[(4, 1)]
    best = ev.records[ev.best_key]
    again = plan_from_dict(best.plan.to_dict())
    assert again == best.plan


def test_every_value_must_split_the_experts_evenly():
    """Mixtral's 8 experts over ep 1 x moe_ep 16 ranks: masked (and tp 8 takes 1, 2, 4, 8 only)."""
    ctx = CostContext(get_model("mixtral-8x7b"), Workload(precision="fp8"), Cluster.simple("h100-sxm", 8))
    space = ServingSpace(ctx, get_runtime("vllm"), max_len=576, tp=(8,), ep=(1,), max_num_seqs=(8,), modes=("agg",),
                         moe_ep=(1, 8, 16))
    assert sorted({space.plan(a).pool.moe_ep for a in space.enumerate()}) == [1, 8]


def test_a_deepep_runtime_searches_expert_tp_only():
    ctx, _, _ = _case()
    space = ServingSpace(ctx, get_runtime("sglang-deepep"), max_len=576, tp=(1, 2, 4), ep=(1,), pp=(1,),
                         max_num_seqs=(8,), modes=("agg",), moe_ep=(1, 2, 4))
    assert {space.plan(a).pool.moe_ep for a in space.enumerate()} == {1}


@pytest.mark.parametrize(("values", "needle"), [([0], "positive"), ([], "empty"), ([2, 4], "include 1"),
                                                ([True], "positive")])
def test_bad_values_name_the_field(values, needle):
    with pytest.raises(ValueError, match="serving.search.moe_ep") as exc:
        _case(moe_ep=values)
    assert needle in str(exc.value)
    dense = CostContext(get_model("llama-3.1-8b"), Workload(precision="fp8"), Cluster.simple("h100-sxm", 1))
    with pytest.raises(ValueError, match="serving.search.moe_ep: llama"):
        ServingSpace(dense, get_runtime("vllm"), max_len=576, tp=(1,), moe_ep=(1, 2))


def test_action_of_refuses_a_layout_the_space_does_not_search():
    from simcore.serving import Pool, ServingPlan, runtime_strategy

    _, _, plain = _case(moe_ep=None)
    with pytest.raises(ValueError, match="serving.search.moe_ep"):
        plain.action_of(ServingPlan("agg", pool=Pool(runtime_strategy(tp=4), 1, 8, moe_ep=4)))


@pytest.mark.slow
def test_search_writes_the_layout_and_sim_replays_it(tmp_path):
    """On deepseek-8node: an exact search over expert TP and EP inside the TP group writes the answer's
    moe_ep into best_plan.yaml and its launches, and shard-sim replays it."""
    common = ["workload=serving", "experiment=deepseek-8node", "serving.concurrency=8", "serving.isl=512",
              "serving.osl=32", "serving.search.tp=[8]", "serving.search.ep=[2]", "serving.search.max_num_seqs=[8]",
              "serving.search.modes=[agg]", "serving.runtime=sglang", "sim.routing.sampled=true"]
    plan, out, _ = search_then_replay(tmp_path, common, "planner=exact", "serving.search.moe_ep=[1,8]",
                                      "serving.search.budget=8", "serving.search.loads=[1]", timeout=600)
    moe_ep = plan["both"].get("moe_ep", 1)
    assert ("--ep-size 16" in (out / "launch_sglang.sh").read_text()) == (moe_ep == 8)
    assert ("--ep-size 2" in (out / "launch_sglang.sh").read_text()) == (moe_ep == 1)


def test_bad_search_values_exit_2_in_one_line(tmp_path):
    proc = run_app("search", "workload=serving", "experiment=dense-70b-1node", "serving.search.moe_ep=[1,8]",
                   f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "serving.search.moe_ep" in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
