"""The serving planner searches speculative decoding: the ``spec_tokens`` head, plans that carry their
draft count into the simulation, the launch exports and ``best_plan.yaml``, and bad values."""

from __future__ import annotations

import pytest
from conftest import run_app, search_then_replay

from planner.serving import ServingEvaluator, ServingSpace, method_config, run_method
from planner.serving.config import plan_from_dict
from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import (
    LengthDist,
    ServingConfig,
    ServingPlan,
    get_runtime,
    runtime_strategy,
    simulate_serving,
)
from simcore.workload import Workload


def _case(spec=(0, 1, 3)):
    ctx = CostContext(get_model("llama-3.1-8b"), Workload(precision="fp8", input_len=512, output_len=64),
                      Cluster.simple("h100-sxm", 2))
    cfg = ServingConfig(concurrency=4, num_requests=8, input_len=LengthDist(mean=512), output_len=LengthDist(mean=64),
                        runtime="vllm", tpot_slo_s=0.05)
    space = ServingSpace(ctx, get_runtime("vllm"), max_len=576, tp=(1, 2), pp=(1,), max_num_seqs=(8,),
                         modes=("agg",), spec_tokens=spec)
    return ctx, cfg, space


def test_a_searched_draft_count_is_a_head_and_each_plan_carries_its_own():
    ctx, cfg, space = _case()
    assert space.heads[-1].name == "spec_tokens" and space.heads[-1].values == (0, 1, 3)
    plans = [space.plan(a) for a in space.enumerate()]
    assert sorted({p.spec_tokens for p in plans}) == [0, 1, 3]
    assert len(plans) == 3 * len({p.describe().split(", spec")[0] for p in plans})
    for a in space.enumerate():
        assert (space.action_of(space.plan(a)) == a).all()
    # the Megatron-style warm start keeps the runtime's own (no speculation in profile vllm)
    assert {space.plan(a).spec_tokens for a in space.megatron()} == {0}
    # not searched: no head (the space, so every seeded search, is the one without it), plans leave it
    # to the runtime
    _, _, plain = _case(spec=None)
    assert plain.heads[-1].name == "max_num_seqs" and plain.num_heads == 10
    assert {plain.plan(a).spec_tokens for a in plain.enumerate()} == {None}


def test_a_plan_with_a_draft_count_simulates_as_the_runtime_with_it():
    ctx, cfg, _ = _case()
    plan = ServingPlan.aggregated(runtime_strategy(tp=1), 1, 8)
    rt = get_runtime("vllm")
    spec = simulate_serving(ctx, ServingPlan("agg", pool=plan.pool, spec_tokens=2), cfg, runtime=rt)
    same = simulate_serving(ctx, plan, cfg, runtime=rt.with_overrides(spec_tokens=2))
    assert spec.metrics.to_dict() == same.metrics.to_dict()
    plain = simulate_serving(ctx, plan, cfg, runtime=rt)
    assert spec.metrics.tpot_s["mean"] < plain.metrics.tpot_s["mean"]  # 4 sequences: decode-bound, speculation pays
    # an explicit 0 switches off a runtime's own speculation
    off = simulate_serving(ctx, ServingPlan("agg", pool=plan.pool, spec_tokens=0), cfg,
                           runtime=rt.with_overrides(spec_tokens=2))
    assert off.metrics.to_dict() == plain.metrics.to_dict()


def test_the_search_picks_among_draft_counts_and_the_exports_follow_the_answer():
    from simcore.export.serving import serving_launch

    ctx, cfg, space = _case()
    ev = ServingEvaluator(ctx, space, cfg, budget=space.size)
    run_method("exact", ev, method_config(), 0)
    best = ev.records[ev.best_key]
    by_spec = {k: max(r.tokens_per_s_per_gpu for r in ev.records.values() if r.plan.spec_tokens == k and r.meets)
               for k in (0, 1, 3)}
    assert best.tokens_per_s_per_gpu == max(by_spec.values())
    assert best.plan.spec_tokens > 0  # 4 clients of Llama-8B: decode-bound, a draft pays (default acceptance)
    again = plan_from_dict(best.plan.to_dict())
    assert again == best.plan and again.spec_tokens == best.plan.spec_tokens
    text = serving_launch(best.plan, ctx.model, "vllm").to_text()
    assert f'"num_speculative_tokens": {best.plan.spec_tokens}' in text.replace("'", '"')


@pytest.mark.parametrize(("values", "needle"), [([-1], "-1"), ([6], "acceptance rates for 5"), ([], "empty")])
def test_bad_draft_counts_name_the_field(values, needle):
    ctx = CostContext(get_model("llama-3.1-8b"), Workload(precision="fp8"), Cluster.simple("h100-sxm", 1))
    with pytest.raises(ValueError, match="serving.search.spec_tokens") as exc:
        ServingSpace(ctx, get_runtime("vllm"), max_len=576, tp=(1,), spec_tokens=values)
    assert needle in str(exc.value)
    pool = ServingPlan.aggregated(runtime_strategy(tp=1)).pool
    with pytest.raises(ValueError, match="plan.spec_tokens"):
        ServingPlan("agg", pool=pool, spec_tokens=-2)
    with pytest.raises(ValueError, match="serving.plan.spec_tokens"):  # a best_plan.yaml edited by hand
        plan_from_dict({"mode": "agg", "pool": {"tp": 1}, "spec_tokens": "two"})


def test_search_writes_the_draft_count_and_sim_replays_it(tmp_path):
    common = ["workload=serving", "experiment=dense-70b-1node", "serving.concurrency=4", "serving.isl=256",
              "serving.osl=32", "serving.tpot_slo_ms=60", "serving.search.tp=[8]", "serving.search.max_num_seqs=[8]",
              "serving.search.modes=[agg]"]
    plan, out, replay = search_then_replay(tmp_path, common, "planner=exact", "serving.search.spec_tokens=[0,2]",
                                           "serving.search.budget=4", "serving.search.loads=[1]")
    assert plan["spec_tokens"] == 2  # 4 clients on 8 GPUs of Llama-70B: decode-bound
    assert "--speculative-config" in (out / "launch_vllm.sh").read_text()
    assert replay["serving"]["spec_tokens"] == 2
    bad = run_app("search", *common, "serving.search.spec_tokens=[9]", f"hydra.run.dir={tmp_path / 'bad'}",
                  cwd=tmp_path)
    assert bad.returncode == 2 and "serving.search.spec_tokens" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0, bad.stderr
    assert not (tmp_path / "bad" / "serving_sims.pkl").exists()  # refused before the journal is opened
