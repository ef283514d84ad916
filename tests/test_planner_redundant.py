"""Redundant experts as a searchable dimension: keys with and without the column, the head and its
masks, the exact baseline and the iterative planners finding replicas where skewed routing pays them."""

import dataclasses

import numpy as np
import pytest

from planner.actions import REDUNDANT, ActionSpace
from planner.config import planner_config
from planner.evaluator import Evaluator
from planner.exact import brute_force, exact_optimum
from planner.megatron import BASE_WIDTH, KEY_WIDTH, canonical_key, full_keys, strategy_from_key
from planner.runner import run_planner
from planner.space import SearchSpace
from simcore.config import SpaceConfig, build_space
from simcore.cost.memory import bit
from simcore.models import get_model
from simcore.moe.routing import RoutingConfig
from simcore.strategy.sharding import Strategy, megatron_strategy
from tests.conftest import make_ctx

ZIPF = RoutingConfig(distribution="zipf", zipf_skew=1.2)
# Qwen3-235B (128 experts) decode on 8 GPUs: under Zipf routing the best plan is EP8 with one replica per rank
SPACE = SearchSpace(8, (1, 8), (1, 2, 4, 8), (1, 2), (256, 1024), (1, 2), (0, 1, 2, 4))


def qwen(precision: str = "fp8", routing=ZIPF):
    return dataclasses.replace(make_ctx("qwen3-235b-a22b", 8, precision=precision), routing=routing)


# ----- keys --------------------------------------------------------------------------------------------
def test_keys_round_trip_with_and_without_the_redundant_column():
    s = Strategy(tp=2, ep=32, pp=1, dp=1, batch=256, redundant_experts=32)
    assert len(s.key()) == KEY_WIDTH and strategy_from_key(s.key()) == s
    plain = megatron_strategy(tp=2, ep=8, batch=64)
    assert strategy_from_key(plain.key()[:BASE_WIDTH]) == plain == strategy_from_key(plain.key())
    assert full_keys(plain.key()[:BASE_WIDTH]).tolist() == [list(plain.key())]
    assert full_keys([s.key(), s.key()]).shape == (2, KEY_WIDTH) and full_keys(np.zeros((0, BASE_WIDTH))).shape == (0, KEY_WIDTH)
    model = get_model("deepseek-v3")
    assert canonical_key(plain.key()[:BASE_WIDTH], model) == canonical_key(plain.key(), model)
    assert len(canonical_key(plain.key()[:BASE_WIDTH], model)) == KEY_WIDTH
    assert canonical_key(s.key(), model)[-1] == 32  # replicas are part of the plan's identity
    with pytest.raises(ValueError, match="columns"):
        canonical_key(s.key()[:10], model)


# ----- the head ----------------------------------------------------------------------------------------
def test_no_head_where_replicas_cannot_help():
    # a dense model, even when a routing config and replica options are given
    dense = dataclasses.replace(make_ctx("llama-3.1-70b", 8), routing=ZIPF)
    space = SearchSpace.for_context(dense, redundant_per_rank=(0, 1, 2, 4))
    assert space.redundant_per_rank == (0,)
    actions = ActionSpace(dense, space)
    assert REDUNDANT not in [h.name for h in actions.heads] and actions.key_width == BASE_WIDTH
    assert actions.to_keys(actions.sample(None, np.random.default_rng(0), 5))[0].shape == (5, BASE_WIDTH)
    # an MoE model under the proxy's uniform routing (no routing config) or expected uniform routing
    for routing in (None, RoutingConfig()):
        assert SearchSpace.for_context(qwen(routing=routing), redundant_per_rank=(0, 1)).redundant_per_rank == (0,)
    # shard-search's space: replicas for MoE under skewed routing only
    assert build_space(qwen(), SpaceConfig()).redundant_per_rank == (0, 1, 2, 4)
    assert build_space(dense, SpaceConfig()).redundant_per_rank == (0,)
    with pytest.raises(ValueError, match="redundant_per_rank"):
        SearchSpace(8, (1,), (1, 8), (1,), (64,), (1,), (1, 2))  # must offer 0


def test_redundant_head_maps_to_replicas_per_rank_and_round_trips():
    ctx = qwen()
    actions = ActionSpace(ctx, SPACE)
    names = [h.name for h in actions.heads]
    assert names[: actions.num_coarse] == ["tp", "ep", "pp", "microbatches", "batch", REDUNDANT]
    acts = actions.sample(None, np.random.default_rng(1), n=400)
    keys, inside = actions.to_keys(acts)
    assert keys.shape == (400, KEY_WIDTH) and inside.all()
    k = np.array(SPACE.redundant_per_rank)[acts[:, actions.redundant_index]]
    assert (keys[:, BASE_WIDTH] == k * keys[:, 1]).all()
    assert (keys[keys[:, 1] == 1, BASE_WIDTH] == 0).all()  # masked to 0 at ep = 1
    assert (keys[:, BASE_WIDTH] > 0).any()
    assert (actions.from_keys(keys) == acts).all() and (actions.from_keys(keys[:, :BASE_WIDTH])[:, :5] == acts[:, :5]).all()
    # keys of either width go through the evaluator; replicas that are no option of the space are outside
    ev = Evaluator(ctx, actions, budget=10)
    plain = megatron_strategy(tp=1, ep=8, batch=1024)
    old = ev.evaluate_keys([plain.key()[:BASE_WIDTH]])
    out = ev.evaluate_keys([plain.replace(redundant_experts=8).key(), plain.replace(redundant_experts=5).key()])
    assert old.keys.tolist() == [list(plain.key())] and out.keys.shape == (2, KEY_WIDTH)
    assert old.valid[0] and out.valid[0] and np.isnan(out.tokens_per_s_per_gpu[1]) and ev.calls == 3
    assert out.tokens_per_s_per_gpu[0] > old.tokens_per_s_per_gpu[0]  # replicas balance the Zipf load


def test_memory_mask_removes_only_replicas_no_plan_can_hold():
    ctx = qwen("bf16")  # bf16 weights fill most of the HBM: replicas overflow it
    space = dataclasses.replace(SPACE, pp=(1,), microbatches=(1,), redundant_per_rank=(0, 1, 4))
    actions = ActionSpace(ctx, space)
    i = actions.redundant_index
    row = [actions.heads[j].values.index(v) for j, v in enumerate((1, 8, 1, 1, 1024))]  # tp, ep, pp, mb, batch
    assert actions.head_mask(i, np.array([row + [0] * (actions.num_heads - 5)]))[0].tolist() == [True, False, False]
    # sound: every valid plan of brute force uses a value its mask allows (fp8: replicas fit and win)
    for precision in ("bf16", "fp8"):
        ctx = qwen(precision)
        actions = ActionSpace(ctx, space)
        bf = brute_force(ctx, space)
        valid = bf.keys[bf.reasons == 0]
        acts = actions.from_keys(valid)
        assert actions.masks(acts)[np.arange(len(acts)), actions.offsets[i] + acts[:, i]].all()
        assert (valid[:, BASE_WIDTH] > 0).any() == (precision == "fp8")
        assert ((bf.reasons & bit("hbm_capacity")) != 0)[bf.keys[:, BASE_WIDTH] > 0].all() == (precision == "bf16")


# ----- planners ----------------------------------------------------------------------------------------
def test_exact_enumerates_replicas_and_equals_brute_force():
    ctx = qwen()
    space = dataclasses.replace(SPACE, pp=(1,), microbatches=(1,))
    fast, ref = exact_optimum(ctx, space), brute_force(ctx, space)
    assert fast.tokens_per_s_per_gpu == pytest.approx(ref.tokens_per_s_per_gpu, rel=1e-12)
    assert fast.key[BASE_WIDTH] == 8 and fast.key[1] == 8  # EP8, one replica per rank
    without = exact_optimum(ctx, dataclasses.replace(space, redundant_per_rank=(0,)))
    assert without.key[BASE_WIDTH] == 0 and fast.tokens_per_s_per_gpu > 1.1 * without.tokens_per_s_per_gpu
    options = {k * ep for ep in space.ep for k in space.redundant_per_rank if ep > 1 or k == 0}
    assert {0, 8} <= set(np.unique(fast.keys[:, BASE_WIDTH]).tolist()) <= options
    assert set(np.unique(ref.keys[:, BASE_WIDTH]).tolist()) == options == {0, 2, 4, 8, 16, 32}


def test_top_k_with_replicas_equals_brute_force():
    from planner.topk import top_k

    ctx = qwen()
    space = dataclasses.replace(SPACE, pp=(1,), microbatches=(1,))
    ref = brute_force(ctx, space)
    best: dict[tuple, float] = {}
    for key, v, r in zip(map(tuple, ref.keys.tolist()), ref.values, ref.reasons, strict=True):
        c = canonical_key(key, ctx.model)
        if r == 0 and v > best.get(c, -np.inf):
            best[c] = float(v)
    got = top_k(ctx, space, 40)
    np.testing.assert_allclose(got.values, sorted(best.values(), reverse=True)[:40], rtol=1e-12)
    assert got.keys.shape[1] == KEY_WIDTH and got.keys[0, BASE_WIDTH] == 8 and len(set(got.keys[:, BASE_WIDTH])) > 1


@pytest.mark.parametrize("name", ["ppo", "random", "genetic"])
def test_search_finds_replicas_under_zipf_routing(name):
    ctx = qwen()
    network = {"d_model": 32, "hidden": 32} if name == "ppo" else {}
    result = run_planner(ctx, SPACE, planner_config(name, budget=120, chunks=3, **network), 0)
    exact = exact_optimum(ctx, SPACE).tokens_per_s_per_gpu
    assert result.keys.shape[1] == KEY_WIDTH and result.best_key[BASE_WIDTH] > 0
    assert result.best_strategy.redundant_experts == result.best_key[BASE_WIDTH]
    assert 0.95 * exact <= result.best_value <= exact * (1 + 1e-12)


def test_megatron_keeps_no_replicas_and_candidates_write_them(tmp_path):
    from planner.apps.outputs import sharding_diff, write_candidates

    ctx = qwen()
    meg = run_planner(ctx, SPACE, planner_config("megatron"), 0)
    assert meg.keys.shape[1] == KEY_WIDTH and not meg.keys[:, BASE_WIDTH].any()
    result = run_planner(ctx, SPACE, planner_config("random", budget=40), 0)
    write_candidates(tmp_path / "candidates.csv", result)
    rows = [line.split(",") for line in (tmp_path / "candidates.csv").read_text().splitlines()]
    col = rows[0].index("redundant_experts")
    assert rows[0][col - 1] == "lm_head" and [int(r[col]) for r in rows[1:]] == result.keys[:, BASE_WIDTH].tolist()
    assert sharding_diff(megatron_strategy(ep=8, redundant_experts=8), ("qkv",)) == "redundant_experts=8"
