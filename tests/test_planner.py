"""Planners: action space and masks, evaluator accounting, budgets, determinism, checkpoint and resume."""

from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.actions import ActionSpace
from planner.checkpoint import config_difference
from planner.config import SCHEMAS, PlannerBaseConfig, PPOPlannerConfig, check_planner, planner_config
from planner.elite import Elite
from planner.evaluator import Evaluator
from planner.megatron import strategy_from_key
from planner.runner import ITERATIVE, SearchInterrupted, run_planner
from planner.search import PPOSearch, reward
from planner.space import SearchSpace
from simcore.cost.lowering import StrategyArrays
from simcore.cost.memory import bit, structural_reasons
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS
from simcore.strategy.sharding import megatron_sharding
from tests.conftest import make_ctx

DIVISIBILITY = bit("heads_divisibility") | bit("feature_divisibility") | bit("batch_divisibility")


@pytest.fixture(scope="module")
def dense():
    from validation.studies.common.scenarios import scenario_context

    ctx = scenario_context("dense-70b-1node")
    return ctx, SearchSpace.for_context(ctx)


SMALL = {"budget": 60, "chunks": 3, "d_model": 32, "hidden": 32}  # each planner takes those it has


def small(name: str, **changes) -> PlannerBaseConfig:
    knobs = {f.name for f in fields(SCHEMAS[name])}
    return planner_config(name, **({k: v for k, v in SMALL.items() if k in knobs} | changes))


# ----- action space ------------------------------------------------------------------------------------
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(["mixtral-8x7b", "deepseek-v3", "llama-3.1-70b"]))
def test_masked_samples_are_in_the_space_and_divisible(seed, model):
    ctx = make_ctx(model, 16)
    space = SearchSpace.for_context(ctx)
    actions = ActionSpace(ctx, space, masking=True)
    acts, masks = actions.sample(None, np.random.default_rng(seed), n=200, with_masks=True)
    keys, inside = actions.to_keys(acts)
    assert inside.all()
    assert not (structural_reasons(ctx, StrategyArrays.from_keys(keys)) & DIVISIBILITY).any()
    assert (masks == actions.masks(acts)).all()
    assert (actions.from_keys(keys) == acts).all()


def test_dense_models_have_no_router_or_expert_heads(dense):
    ctx, space = dense
    names = [h.name for h in ActionSpace(ctx, space).heads]
    assert names[:5] == ["tp", "ep", "pp", "microbatches", "batch"]
    assert not {"router", "expert_ffn1", "shared_ffn1"} & set(names)
    with_dp = ActionSpace(ctx, space, dp_head=True, microbatch_head=False)
    assert [h.name for h in with_dp.heads][:5] == ["tp", "ep", "pp", "dp", "batch"]


def test_unmasked_proposals_outside_the_space_count_but_are_not_priced(dense):
    ctx, space = dense
    actions = ActionSpace(ctx, space, masking=False)
    acts = actions.sample(None, np.random.default_rng(0), n=300)
    _, inside = actions.to_keys(acts)
    assert (~inside).any()
    ev = Evaluator(ctx, actions, budget=1000)
    out = ev.evaluate_actions(acts)
    assert ev.calls == 300 and ev.proxy_evals == len({tuple(k) for k in out.keys[inside].tolist()})
    assert np.isnan(out.tokens_per_s_per_gpu[~inside]).all() and not out.valid[~inside].any()
    assert ev.reasons(int(np.flatnonzero(~inside)[0])) == ["outside_space"]


def test_evaluator_counts_repeats_and_stops_at_the_budget(dense):
    ctx, space = dense
    actions = ActionSpace(ctx, space)
    ev = Evaluator(ctx, actions, budget=5)
    one = actions.sample(None, np.random.default_rng(1), n=1)
    out = ev.evaluate_actions(np.repeat(one, 3, axis=0))
    assert len(out) == 3 and ev.calls == 3 and ev.proxy_evals == 1
    out = ev.evaluate_actions(actions.sample(None, np.random.default_rng(2), n=10))
    assert len(out) == 2 and ev.calls == 5 and ev.done
    assert len(ev.evaluate_actions(one)) == 0


def test_elite_keeps_the_best_distinct_records():
    elite = Elite(2)
    assert elite.offer(1.0, (0, 1)) and elite.offer(2.0, (1, 1))
    assert not elite.offer(0.5, (2, 2))          # worse than the worst
    assert not elite.offer(3.0, (1, 1))          # already there
    assert elite.offer(1.5, (2, 2))
    assert [v for v, _ in elite.records] == [2.0, 1.5]


def test_diverse_elite_keeps_one_record_per_layout():
    elite = Elite(3, distinct_prefix=2)
    assert elite.offer(1.0, (0, 0, 5)) and elite.offer(2.0, (1, 0, 5))
    assert not elite.offer(0.9, (0, 0, 6))       # same layout (first two heads), not better
    assert elite.offer(1.5, (0, 0, 7))           # same layout, better: replaces (0, 0, 5)
    assert elite.offer(0.5, (2, 2, 0))           # a third layout fills the history
    assert elite.records == [(2.0, (1, 0, 5)), (1.5, (0, 0, 7)), (0.5, (2, 2, 0))]


def test_polish_climbs_to_a_local_optimum_within_the_budget(dense):
    ctx, space = dense
    actions = ActionSpace(ctx, space)
    ev = Evaluator(ctx, actions, budget=3000)
    search = PPOSearch(actions, small("ppo", T=1, polish=True), seed=0)
    rng = np.random.default_rng(5)
    start = next(a for a in actions.sample(None, rng, n=50) if ev.evaluate_actions(a[None]).valid[0])
    first = ev.lookup(actions.to_keys(start[None])[0][0])
    search.elite.offer(ev.normalized(first), start)
    search._polish(ev, ev.budget, lambda: False)
    assert 0 < ev.calls < ev.budget                          # it stopped by itself, not by the budget
    value, best = search.elite.records[0]
    assert ev.normalized(first) <= value
    for i, size in enumerate(actions.sizes.tolist()):       # no priced one-head neighbour is better
        for v in range(size):
            row = np.array(best)
            row[i] = v
            keys, inside = actions.to_keys(row[None])
            neighbour = ev.lookup(keys[0]) if inside[0] else None
            assert neighbour is None or ev.normalized(neighbour) <= value + 1e-12


def test_reward_is_eq_1():
    assert reward(1.2, 1.0, alpha=1.0, beta=2.0, invalid=-1.0) == pytest.approx(1.2 + 2.0 * 0.2)
    assert reward(0.8, 1.0, alpha=0.5, beta=1.0, invalid=-1.0) == pytest.approx(0.4 - 0.2)
    assert reward(0.8, None, alpha=1.0, beta=1.0, invalid=-1.0) == pytest.approx(0.8)
    assert reward(None, 1.0, alpha=1.0, beta=1.0, invalid=-7.0) == -7.0


# ----- re-ranking --------------------------------------------------------------------------------------
def test_canonical_key_merges_plans_that_cannot_differ():
    from planner.megatron import canonical_key
    from simcore.cost.proxy import evaluate
    from simcore.models import get_model

    model = get_model("mixtral-8x7b")  # MoE without shared experts or dense layers
    ctx = make_ctx("mixtral-8x7b", 16, "decode")
    rng = np.random.default_rng(0)
    tp1 = [(1, 8, 2, 1, 64, 2, *rng.integers(0, 3, 12).tolist()) for _ in range(6)]
    assert len({canonical_key(k, model) for k in tp1}) == 1
    values = {round(evaluate(ctx, strategy_from_key(k)).tokens_per_s_per_gpu, 9) for k in tp1}
    assert len(values) == 1  # the claim behind the merge: with tp = 1 no choice changes the cost
    tp2 = [(2, 8, 1, 1, 64, 2, *rng.integers(0, 3, 12).tolist()) for _ in range(30)]
    canon = {canonical_key(k, model) for k in tp2}
    shared = SEARCHABLE_OPS.index("shared_ffn1") + 6
    assert len(canon) > 1 and {c[shared] for c in canon} == {CHOICES.index(megatron_sharding()["shared_ffn1"])}


def test_simulator_reranks_the_distinct_best_plans(dense):
    from planner.rerank import make_reranker, rerank_search
    from simcore.engine import simulate
    from topologies import build_topology

    ctx, space = dense
    result = run_planner(ctx, space, small("random", budget=200), seed=2)
    graph = build_topology("hgx-h100", num_nodes=1)
    ranked = rerank_search(ctx, result, 4, make_reranker(ctx, "sim", graph))
    assert len(ranked) >= 1 and sorted(r.rank for r in ranked) == list(range(1, len(ranked) + 1))
    assert len({repr(r.strategy) for r in ranked}) == len(ranked)
    values = [r.tokens_per_s_per_gpu for r in ranked if r.valid]
    assert values == sorted(values, reverse=True)
    best = ranked[0]
    assert best.tokens_per_s_per_gpu == simulate(ctx, graph, best.strategy).tokens_per_s_per_gpu


# ----- planners ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ITERATIVE))
def test_every_planner_respects_the_budget_and_finds_a_valid_plan(dense, name):
    ctx, space = dense
    result = run_planner(ctx, space, small(name), seed=0)
    assert result.calls == 60 == len(result.keys)
    assert result.best_key is not None and result.best_value > 0
    i = [tuple(k) for k in result.keys.tolist()].index(result.best_key)
    assert result.reasons[i] == 0 and result.values[i] == result.best_value


@pytest.mark.parametrize("name", ["megatron", "exact"])
def test_one_shot_planners(dense, name):
    ctx, space = dense
    result = run_planner(ctx, space, small(name), seed=0)
    assert result.best_key is not None and result.calls >= len(space.degree_grid())


def test_exact_is_an_upper_bound_for_every_planner(dense):
    ctx, space = dense
    exact = run_planner(ctx, space, small("exact"), seed=0).best_value
    for name in ITERATIVE:
        assert run_planner(ctx, space, small(name, budget=40), seed=1).best_value <= exact * (1 + 1e-12)


@pytest.mark.parametrize("name", ["ppo", "genetic", "annealing"])
def test_same_seed_same_result_bit_for_bit(dense, name):
    ctx, space = dense
    a, b = (run_planner(ctx, space, small(name), seed=7) for _ in range(2))
    assert (a.keys == b.keys).all() and np.array_equal(a.values, b.values, equal_nan=True)
    assert a.metrics == b.metrics
    other = run_planner(ctx, space, small(name), seed=8)
    assert not np.array_equal(a.keys, other.keys)


@pytest.mark.parametrize("changes", [{}, {"T": 5, "elite_diverse": True, "polish": True}])
def test_resume_equals_an_uninterrupted_run(dense, tmp_path, changes):
    ctx, space = dense
    cfg = small("ppo", budget=90, **changes)
    config = {"planner": {"name": "ppo", "budget": 90}, "seed": 3}
    whole = run_planner(ctx, space, cfg, seed=3, run_dir=tmp_path / "whole", config=config)
    seen = SimpleNamespace(calls=0)

    def listener(ev):
        seen.calls = ev.calls

    with pytest.raises(SearchInterrupted) as info:
        run_planner(ctx, space, cfg, seed=3, run_dir=tmp_path / "cut", config=config, listener=listener,
                    stop=lambda: seen.calls >= 45)  # in the middle of the second of three chunks
    assert info.value.chunks_done == 1
    resumed = run_planner(ctx, space, cfg, seed=3, run_dir=tmp_path / "cut", config=config, resume=True)
    assert (resumed.keys == whole.keys).all() and np.array_equal(resumed.values, whole.values, equal_nan=True)
    assert resumed.best_key == whole.best_key and resumed.metrics == whole.metrics


def test_resume_refuses_a_different_config(dense, tmp_path):
    ctx, space = dense
    cfg = small("random", budget=30)
    run_planner(ctx, space, cfg, seed=0, run_dir=tmp_path, config={"planner": {"budget": 30}, "seed": 0})
    with pytest.raises(ValueError, match=r"planner\.budget.*30.*31"):
        run_planner(ctx, space, cfg, seed=0, run_dir=tmp_path, config={"planner": {"budget": 31}, "seed": 0},
                    resume=True)
    with pytest.raises(ValueError, match="no checkpoint"):
        run_planner(ctx, space, cfg, seed=0, run_dir=tmp_path / "empty", config={}, resume=True)


def test_config_difference_names_the_first_differing_key():
    assert config_difference({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 2}}) is None
    assert "a.c" in config_difference({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}})
    assert "seed" in config_difference({"seed": 1}, {})


@pytest.mark.parametrize(("field", "value", "message"), [
    ("budget", 0, "planner.budget must be >= 1"), ("T", 0, "planner.T must be >= 1"),
    ("tau", 0.0, r"planner.tau must be in \(0, 1\]"), ("tau", 1.5, "planner.tau"),
    ("name", "ppo2", "planner.name"), ("n_heads", 3, "planner.n_heads"), ("reranker", "des", "planner.reranker"),
])
def test_bad_planner_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        check_planner(PPOPlannerConfig(**{field: value}))
    check_planner(PPOPlannerConfig(tau=1.0))
