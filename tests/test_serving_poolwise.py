"""The pool-by-pool screening of disaggregated plans (planner.serving.poolwise) and its seeds in the warm start."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.serving import ServingEvaluator, method_config, run_method
from planner.serving.agg_seeds import aggregated_seeds as _aggregated_seeds
from planner.serving.agg_seeds import screened_decodes
from planner.serving.poolwise import (
    DecodeScreen,
    PrefillOption,
    closed_loop_ttft,
    first_wave_ttft,
    pool_seeds,
    prefill_ttft,
    screen_plans,
    screen_prefill,
)
from planner.serving.space import ServingSpace
from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import (
    LengthDist,
    Pool,
    ServingConfig,
    ServingPlan,
    get_runtime,
    runtime_strategy,
    simulate_serving,
)
from simcore.serving.step_cost import StepCost
from simcore.workload import Workload


def _case(modes=("agg", "disagg"), concurrency=24, ttft=0.5, tpot=0.02, model="llama-3.1-8b", tp=(1, 2, 4)):
    ctx = CostContext(get_model(model), Workload(precision="fp8", input_len=1024, output_len=64),
                      Cluster.simple("h100-sxm", 8))
    cfg = ServingConfig(concurrency=concurrency, num_requests=4 * concurrency, input_len=LengthDist(mean=1024),
                        output_len=LengthDist(mean=64), runtime="vllm", ttft_slo_s=ttft, tpot_slo_s=tpot)
    space = ServingSpace(ctx, get_runtime("vllm"), max_len=1088, tp=tp, pp=(1,), max_num_seqs=(8, 32, 64),
                         modes=modes)
    return ctx, cfg, space


def _costs(space):
    return {lay: StepCost(space.ctx, runtime_strategy(*lay), space.runtime) for lay in space.layouts}


def test_prefill_queue():
    p = PrefillOption((2, 1, 1), one_s=0.1, full_s=0.4, per_group=4)
    assert p.step_s(1) == 0.1 and p.step_s(4) == 0.4 and p.step_s(2.5) == pytest.approx(0.25)
    assert p.capacity_rps == pytest.approx(10.0)
    assert prefill_ttft(p, 1, 1e-6) == pytest.approx(0.1, rel=1e-4)  # alone: its own step
    ttfts = [prefill_ttft(p, 1, r) for r in (1.0, 4.0, 8.0, 9.9)]
    assert ttfts == sorted(ttfts) and ttfts[-1] > 10 * ttfts[0]  # queueing grows toward capacity
    assert prefill_ttft(p, 1, 10.0) == math.inf and prefill_ttft(p, 2, 10.0) < math.inf
    # M/D/1 at one prompt a step: rate 5/s, T 0.1 s, rho 0.5: wait 0.5 x 0.1 / (2 x 0.5) = 0.05
    assert prefill_ttft(PrefillOption((1, 1, 1), 0.1, 0.1, 1), 1, 5.0) == pytest.approx(0.15)
    # every client at once: 40 prompts on 2 workers, 20 each, waves of 4: 5 waves, mean 3 full steps
    assert first_wave_ttft(p, 2, 40) == pytest.approx(0.4 * 3)
    assert first_wave_ttft(p, 2, 6) == pytest.approx(p.step_s(3))  # one step of 3 each


def test_closed_loop_keeps_littles_law():
    p = PrefillOption((2, 1, 1), one_s=0.1, full_s=0.4, per_group=4)
    away = 3.0
    for clients in (1, 8, 24):
        ttft, rps = closed_loop_ttft(p, 1, clients, away)
        assert rps * (ttft + away) == pytest.approx(clients, rel=1e-3)
        assert rps < p.capacity_rps
    ttft, rps = closed_loop_ttft(p, 1, 200, away)  # more clients than the pool serves: it saturates
    assert 0.99 * p.capacity_rps < rps < p.capacity_rps
    assert rps * (ttft + away) == pytest.approx(200, rel=1e-3) and ttft > 10


def test_first_seed_meets_the_slos_in_simulation():
    """The screening's best closed-loop plan, simulated: both means within their SLOs, its TPOT as
    screened (the same step cost) and its TTFT no more than 40% above the screened one (the screening
    leaves out the hand-off and the decode pool's queueing)."""
    ctx, cfg, space = _case(concurrency=32, ttft=1.0, tpot=0.02, model="llama-3.1-70b", tp=(2, 4))
    best = screen_plans(space, cfg, 1)
    assert len(best) == 1
    m = simulate_serving(ctx, best[0].plan, cfg).metrics
    assert m.ttft_s["mean"] <= cfg.ttft_slo_s and m.tpot_s["mean"] <= cfg.tpot_slo_s
    assert m.tpot_s["mean"] == pytest.approx(best[0].tpot_s, rel=0.1)
    assert best[0].ttft_s < m.ttft_s["mean"] < 1.4 * best[0].ttft_s


def test_seeds_are_distinct_disaggregated_plans_of_the_space():
    _, cfg, space = _case()
    seeds = pool_seeds(space, cfg, 4)
    assert 1 <= len(seeds) <= 4
    assert space.inside(np.array(seeds)).all()
    plans = [space.plan(a) for a in seeds]
    assert all(p.mode == "disagg" for p in plans)
    assert len({tuple(a.tolist()) for a in seeds}) == len(seeds)
    assert pool_seeds(space, cfg, 0) == []
    _, cfg, agg_only = _case(modes=("agg",))
    assert pool_seeds(agg_only, cfg, 4) == []


def test_screened_pools_meet_their_slos():
    _, cfg, space = _case()
    costs = _costs(space)
    for p in screen_prefill(space, costs, cfg):
        assert p.one_s <= cfg.ttft_slo_s and p.capacity_rps > 0
    screen = DecodeScreen(space, costs, cfg)
    options = [screen.option(lay, 64, 24.0) for lay in space.layouts]
    assert any(o is not None for o in options)
    assert all(o.tpot_s <= cfg.tpot_slo_s for o in options if o is not None)
    _, strict, space_strict = _case(tpot=1e-4)  # a TPOT no step meets: no decode option, no seed
    assert all(DecodeScreen(space_strict, costs, strict).option(lay, 64, 24.0) is None for lay in space.layouts)
    assert pool_seeds(space_strict, strict, 4) == []


def test_screened_tpot_is_the_simulated_tpot():
    """A decode worker fed by one prefill worker at a closed loop it can hold whole: the simulator's mean
    TPOT is the screening's step at that batch (the same step cost; the simulator adds the prompts'
    arrivals and hand-offs, so a batch that is not always full). A 70B model, so the GPU's step, not the
    host's, sets the TPOT, and it differs by layout."""
    ctx, cfg, space = _case(concurrency=16, ttft=None, tpot=None, model="llama-3.1-70b", tp=(2, 4))
    screen = DecodeScreen(space, _costs(space), cfg)
    tpots = {}
    for lay in ((2, 1, 1), (4, 1, 1)):
        screened = screen.option(lay, 64, 16.0)
        assert screened.tpot_s > space.runtime.host_s(16)
        plan = ServingPlan("disagg", prefill=Pool(runtime_strategy(tp=4), 1, 64), decode=Pool(runtime_strategy(*lay), 1, 64))
        sim = simulate_serving(ctx, plan, cfg)
        assert sim.feasible
        assert sim.metrics.tpot_s["mean"] == pytest.approx(screened.tpot_s, rel=0.1)
        tpots[lay] = screened.tpot_s
    assert tpots[(4, 1, 1)] < 0.8 * tpots[(2, 1, 1)]


def test_warm_start_adds_the_seeds_within_an_eighth_of_the_budget():
    ctx, cfg, space = _case()
    heuristic = len(space.megatron())
    ev = ServingEvaluator(ctx, space, cfg, budget=16, pool_seeds=4)
    run_method("poolwise", ev, method_config(), 0)
    assert ev.sims == heuristic + 2  # 16 // 8: one disaggregated seed, one kept for its aggregated counterpart
    assert sum(r.plan.mode == "disagg" for r in ev.records.values()) == 1
    ev = ServingEvaluator(ctx, space, cfg, budget=8, pool_seeds=4)
    run_method("poolwise", ev, method_config(), 0)
    assert ev.sims == heuristic + 1  # an eighth of one: the disaggregated seed alone
    assert sum(r.plan.mode == "disagg" for r in ev.records.values()) == 1
    ev = ServingEvaluator(ctx, space, cfg, budget=16, pool_seeds=4)
    run_method("megatron", ev, method_config(), 0)
    assert ev.sims == heuristic and all(r.plan.mode == "agg" for r in ev.records.values())
    ev = ServingEvaluator(ctx, space, cfg, budget=64, pool_seeds=0)
    run_method("poolwise", ev, method_config(), 0)
    assert ev.sims == heuristic
    with pytest.raises(ValueError, match="pool_seeds"):
        ServingEvaluator(ctx, space, cfg, budget=8, pool_seeds=-1)


def aggregated_seeds(space, screened, k, cfg):
    """The aggregated counterparts of the screened disaggregated plans."""
    return _aggregated_seeds(space, screened_decodes(screened), k, cfg)


def _seed_plans(space, screened, k, cfg):
    return [space.plan(a) for a in aggregated_seeds(space, screened, k, cfg)]


def _fits(space, plan):
    gpus = plan.pool.strategy.tp * plan.pool.strategy.ep * plan.pool.strategy.pp
    return [w for w in space.heads[4].values if w * gpus <= space.num_gpus]


def test_aggregated_seeds_are_the_screened_decode_layouts():
    """One aggregated plan per distinct decode layout of the screened plans, in their order, with that
    pool's max_num_seqs, and either as many workers as the cluster holds or the fewest that hold every
    closed-loop client; under open arrivals always the former; none without aggregated plans."""
    from dataclasses import replace

    _, cfg, space = _case()
    screened = screen_plans(space, cfg, 4)
    seeds = aggregated_seeds(space, screened, 4, cfg)
    layouts = list(dict.fromkeys((s.plan.decode.strategy.tp, s.plan.decode.strategy.ep, s.plan.decode.strategy.pp)
                                 for s in screened))
    assert 1 <= len(seeds) == len(layouts)
    assert space.inside(np.array(seeds)).all()
    poisson = replace(cfg, arrival="poisson", rate=4.0)
    for plan, open_plan, lay in zip([space.plan(a) for a in seeds], _seed_plans(space, screened, 4, poisson), layouts,
                                    strict=True):
        st = plan.pool.strategy
        assert plan.mode == "agg" and (st.tp, st.ep, st.pp) == lay
        first = next(s for s in screened if (s.plan.decode.strategy.tp, s.plan.decode.strategy.ep,
                                             s.plan.decode.strategy.pp) == lay)
        seqs = first.plan.decode.max_num_seqs
        assert plan.pool.max_num_seqs == seqs
        fits = _fits(space, plan)
        few = min(w for w in fits if w * seqs >= cfg.concurrency)
        assert plan.pool.workers in (few, max(fits))
        assert open_plan.pool.workers == max(fits)  # no client count: the cluster's most
    assert [a.tolist() for a in aggregated_seeds(space, screened, 1, cfg)] == [seeds[0].tolist()]
    assert aggregated_seeds(space, screened, 0, cfg) == []
    _, cfg, disagg_only = _case(modes=("disagg",))
    assert aggregated_seeds(disagg_only, screen_plans(disagg_only, cfg, 4), 4, cfg) == []


def test_aggregated_seed_at_low_load_is_one_worker():
    """8 clients on one node, the screened decode pool holding 8 sequences, TTFT <= 500 ms: the first
    aggregated seed is one worker (filling the cluster, 8 workers of one client each, runs at about an
    eighth of the tokens/s per GPU), its prefill meeting the SLO as the screening prices it."""
    from planner.serving.poolwise import closed_screened_ttft, prefill_option

    _, cfg, space = _case(concurrency=8)
    screened = screen_plans(space, cfg, 4)
    first = _seed_plans(space, screened, 1, cfg)[0]
    assert first.pool.max_num_seqs >= 8 and first.pool.workers == 1 < max(_fits(space, first))
    lay = (first.pool.strategy.tp, first.pool.strategy.ep, first.pool.strategy.pp)
    prefill = prefill_option(space, _costs(space)[lay], lay, cfg)
    assert closed_screened_ttft(prefill, 1, cfg, screened[0].tpot_s, space.runtime)[0] <= cfg.ttft_slo_s


def test_aggregated_seeds_fill_the_cluster_where_few_workers_miss_the_ttft():
    """64 clients, TTFT <= 200 ms: one worker's batch holds them all, but its prompts would queue past the
    SLO (the screening's prefill pricing), so every seed fills the cluster; at 500 ms the 2-GPU layout's
    one worker keeps up and is seeded alone, while the 1-GPU layout still fills the node."""
    _, cfg, space = _case(concurrency=64, ttft=0.2)
    plans = _seed_plans(space, screen_plans(space, cfg, 4), 4, cfg)
    assert plans and all(p.pool.workers == max(_fits(space, p)) for p in plans)
    assert any(p.pool.max_num_seqs >= 64 and max(_fits(space, p)) > 1 for p in plans)  # one worker would hold them
    _, cfg, space = _case(concurrency=64, ttft=0.5)
    by_tp = {p.pool.strategy.tp: p.pool.workers for p in _seed_plans(space, screen_plans(space, cfg, 4), 4, cfg)}
    assert by_tp[1] == 8 and by_tp[2] == 1


def test_warm_start_adds_the_aggregated_seeds_in_what_the_eighth_leaves():
    """At a budget of 64 the eighth holds 8 seeds: the 4 disaggregated ones, then their aggregated
    counterparts; each simulated once beside the Megatron-style plans."""
    ctx, cfg, space = _case()
    screened = screen_plans(space, cfg, 4)
    agg = aggregated_seeds(space, screened, 8 - len(screened), cfg)
    assert agg
    ev = ServingEvaluator(ctx, space, cfg, budget=64, pool_seeds=4)
    run_method("poolwise", ev, method_config(), 0)
    expected = {tuple(int(x) for x in a) for a in list(space.megatron()) + [s.action for s in screened] + agg}
    assert ev.sims == len(expected)
    simulated = {tuple(int(x) for x in space.action_of(r.plan)) for r in ev.records.values()}
    assert {tuple(int(x) for x in a) for a in agg} <= simulated


def _decode_score(space, pick, cfg):
    """Output tokens/s per GPU of the pick's decode steps as the screening prices them (one worker)."""
    screen = DecodeScreen(space, _costs(space), cfg)
    d = screen.option(pick.layout, pick.pool.max_num_seqs, float(cfg.concurrency))
    return d.sequences / (d.tpot_s * d.gpus)


def test_screen_decodes_ranks_the_layouts_by_decode_throughput_per_gpu():
    """Without disaggregated plans the decode screening picks the layouts alone: distinct, each within
    the TPOT SLO, its one prompt within the TTFT SLO, best decode tokens/s per GPU first; none where no
    prompt meets the TTFT SLO or the space has no aggregated plans."""
    from dataclasses import replace

    from planner.serving.agg_seeds import screen_decodes

    _, cfg, space = _case(modes=("agg",), concurrency=8)
    picks = screen_decodes(space, cfg, 8)
    assert len(picks) == len({p.layout for p in picks}) == len(space.layouts)
    assert picks[0].layout == (1, 1, 1) and picks[0].pool.max_num_seqs >= 8
    assert all(p.tpot_s <= cfg.tpot_slo_s for p in picks)
    scores = [_decode_score(space, p, cfg) for p in picks]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]
    assert [p.layout for p in screen_decodes(space, cfg, 2)] == [p.layout for p in picks[:2]]
    assert screen_decodes(space, cfg, 0) == []
    assert screen_decodes(space, replace(cfg, ttft_slo_s=1e-6), 4) == []
    assert screen_decodes(space, replace(cfg, tpot_slo_s=1e-6), 4) == []
    _, cfg, disagg_only = _case(modes=("disagg",), concurrency=8)
    assert screen_decodes(disagg_only, cfg, 4) == []


def test_aggregated_only_warm_start_seeds_the_load_sized_plan():
    """An aggregated-only space at 8 clients: the warm start simulates one worker of the best decode
    layout beside the Megatron-style plans (which fill the node), and that seed is the best plan; with
    ``pool_seeds`` 0 it is not simulated."""
    ctx, cfg, space = _case(modes=("agg",), concurrency=8)
    ev = ServingEvaluator(ctx, space, cfg, budget=24, pool_seeds=4)
    run_method("poolwise", ev, method_config(), 0)
    assert ev.sims == len(space.megatron()) + 3  # 24 // 8
    best = ev.ranked()[0].plan
    assert best.mode == "agg" and best.pool.workers == 1 and best.pool.strategy.tp == 1 and ev.ranked()[0].meets
    assert all(r.plan.pool.workers == 8 for r in ev.ranked() if r.plan.pool.strategy.tp == 1
               and r.plan.pool.workers != 1)  # the heuristic's tp1 plans fill the node
    ev = ServingEvaluator(ctx, space, cfg, budget=24, pool_seeds=0)
    run_method("poolwise", ev, method_config(), 0)
    assert all(r.plan.pool.workers * r.plan.pool.strategy.tp == 8 for r in ev.records.values())


def test_open_arrivals_fill_what_the_decode_worker_holds():
    """Poisson arrivals have no client count: each decode worker runs as many sequences as its
    ``max_num_seqs`` and KV cache allow (the screening once turned the infinite load into an integer and
    crashed ``shard-search workload=serving serving.rate=...``)."""
    _, closed, space = _case(ttft=None, tpot=None)
    cfg = ServingConfig(arrival="poisson", rate=8.0, num_requests=64, input_len=LengthDist(mean=1024),
                        output_len=LengthDist(mean=64), runtime="vllm")
    screen = DecodeScreen(space, _costs(space), cfg)
    for lay in space.layouts:
        full = screen.option(lay, 64, math.inf)
        assert full is not None
        assert full.sequences == min(64 // lay[1], screen.fits[lay]) * lay[1]
        assert full.sequences >= screen.option(lay, 64, 8.0).sequences
    seeds = pool_seeds(space, cfg, 4)
    assert seeds and all(space.inside(a)[0] for a in seeds)
