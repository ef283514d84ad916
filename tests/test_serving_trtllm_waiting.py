"""TensorRT-LLM holding context requests back: batch waiting (``batch_wait_timeout_iters``,
``batch_wait_max_tokens_ratio``) and attention-DP balancing (``attention_dp_config``): each rule step by
step, its effect on a served run, the fast path with it on, and bad input."""

from __future__ import annotations

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import (
    LengthDist,
    ServingConfig,
    ServingInputError,
    ServingPlan,
    get_runtime,
    simulate_serving,
)
from simcore.serving.kvcache import KvCache
from simcore.serving.requests import Request
from simcore.serving.scheduler import AttentionDpBalance, GroupScheduler
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload
from validation.studies.serving.launch import launch_flags


def _decoding(rid: int) -> Request:
    req = Request(rid, 0.0, input_len=100, output_len=1000)
    req.kv_tokens, req.generated = 100, 1  # its prompt is done: it decodes
    return req


def _scheduler(iters: int, ratio: float, max_tokens: int = 1000) -> GroupScheduler:
    g = GroupScheduler("trtllm", KvCache(10**6, 32), max_num_seqs=64, max_tokens=max_tokens,
                       batch_wait=(iters, ratio))
    for rid in range(3):
        req = _decoding(rid)
        g.kv.grow(req, 1100)
        g.running.append(req)
    return g


def _context_ran(picks) -> bool:
    return any(r.in_prefill for r, _ in picks)


def test_context_waits_timeout_steps_then_runs():
    """A lone prompt among decodes is held exactly ``timeout_iters`` steps (the count is checked before
    it is raised, as ``PyExecutor._waiting_requests`` does), then runs with the decodes."""
    g = _scheduler(iters=5, ratio=0.9)
    g.add(Request(10, 0.0, input_len=200, output_len=10))
    held = 0
    while not _context_ran(picks := g.schedule(set())):
        assert len(picks) == 3  # the decodes still run every step
        held += 1
    assert held == 5 and g.waited == 0


def test_enough_waiting_tokens_end_the_wait_at_once():
    """Prompt tokens plus one per decode reaching ``ratio x max_num_tokens`` stop the waiting."""
    g = _scheduler(iters=50, ratio=0.5, max_tokens=1000)
    g.add(Request(10, 0.0, input_len=300, output_len=10))
    assert not _context_ran(g.schedule(set()))  # 300 + 3 < 500: wait
    g.add(Request(11, 0.0, input_len=300, output_len=10))
    assert _context_ran(g.schedule(set()))  # 600 + 3 >= 500: run both


def test_no_wait_without_decodes_or_when_off():
    idle = GroupScheduler("trtllm", KvCache(10**6, 32), 64, 1000, batch_wait=(20, 0.9))
    idle.add(Request(10, 0.0, input_len=200, output_len=10))
    assert _context_ran(idle.schedule(set()))  # nothing decodes: no dead waiting
    off = _scheduler(iters=0, ratio=0.0)
    off.add(Request(10, 0.0, input_len=200, output_len=10))
    assert _context_ran(off.schedule(set()))


def _ctx():
    return CostContext(get_model("llama-3.1-8b"), Workload(precision="fp8"), Cluster.simple("h200", 8))


def _cfg(**kw):
    return ServingConfig(concurrency=4, num_requests=24, runtime="trtllm", seed=5,
                         input_len=LengthDist("uniform", mean=900, low=800, high=1000),
                         output_len=LengthDist("uniform", mean=90, low=60, high=120), **kw)


def test_waiting_raises_ttft_by_about_the_held_decode_steps():
    """At low load nearly every prompt arrives alone and waits the full timeout: TTFT grows by about
    ``timeout_iters`` decode steps, TPOT barely moves."""
    plan = ServingPlan.aggregated(megatron_strategy(tp=1), 1, 8)
    rt = get_runtime("trtllm")
    base = simulate_serving(_ctx(), plan, _cfg(), runtime=rt)
    wait = simulate_serving(_ctx(), plan, _cfg(), runtime=rt.with_overrides(batch_wait_timeout_iters=20,
                                                                            batch_wait_max_tokens_ratio=0.9))
    extra = wait.metrics.ttft_s["mean"] - base.metrics.ttft_s["mean"]
    step = base.metrics.tpot_s["mean"]
    assert 10 * step < extra < 21 * step
    assert wait.metrics.tpot_s["mean"] == pytest.approx(step, rel=0.15)


@pytest.mark.parametrize("arrival", ["closed", "poisson"])
def test_fast_path_equals_reference_with_batch_waiting(arrival):
    plan = ServingPlan.aggregated(megatron_strategy(tp=2), workers=2, max_num_seqs=16)
    rt = get_runtime("trtllm").with_overrides(batch_wait_timeout_iters=7, batch_wait_max_tokens_ratio=0.5,
                                              max_num_batched_tokens=2048)
    cfg = _cfg(arrival=arrival, rate=30.0)
    fast = simulate_serving(_ctx(), plan, cfg, runtime=rt, fast=True)
    slow = simulate_serving(_ctx(), plan, cfg, runtime=rt, fast=False)
    key = [(r.steps, r.metrics.ttft_s["mean"], r.metrics.tpot_s["mean"], r.metrics.e2e_s["p90"]) for r in (fast, slow)]
    assert key[0] == pytest.approx(key[1], rel=1e-9)


@pytest.mark.parametrize("changes, field", [({"batch_wait_timeout_iters": -1}, "batch_wait_timeout_iters"),
                                            ({"batch_wait_max_tokens_ratio": 1.5}, "batch_wait_max_tokens_ratio")])
def test_bad_batch_waiting_names_the_field(changes, field):
    with pytest.raises(ServingInputError, match=field):
        get_runtime("trtllm").with_overrides(**changes)


def test_batch_waiting_is_tensorrt_llms_only():
    with pytest.raises(ServingInputError, match="TensorRT-LLM"):
        get_runtime("vllm").with_overrides(batch_wait_timeout_iters=20)


def test_the_harness_waits_only_for_llama_70b_at_1k_1k_below_tp8():
    on = launch_flags("trtllm", "llama-3.1-70b", 1024, 1024, 16, tp=4)
    assert on["batch_wait_timeout_iters"] == 20 and on["batch_wait_max_tokens_ratio"] == 0.9
    assert on["max_num_batched_tokens"] == 2248
    assert "batch_wait_timeout_iters" not in launch_flags("trtllm", "llama-3.1-70b", 1024, 1024, 16, tp=8)
    assert "batch_wait_timeout_iters" not in launch_flags("trtllm", "llama-3.1-70b", 8192, 1024, 16, tp=4)


def _groups(n: int, decoding: int = 2) -> list[GroupScheduler]:
    groups = [GroupScheduler("trtllm", KvCache(10**6, 32), 64, 8192) for _ in range(n)]
    for gi, g in enumerate(groups):
        for j in range(decoding):
            req = _decoding(100 * gi + j)
            g.kv.grow(req, 1100)
            g.running.append(req)
    return groups


def _step(balance, groups):
    picks = balance.apply([g.schedule(set()) for g in groups], groups)
    return [_context_ran(p) for p in picks]


def test_attention_dp_holds_a_lone_rank_until_the_timeout():
    """A prompt on one rank of two waits until the count reaches ``timeout_iters``; the count rises on
    every held step (it had risen 2 steps before the prompt came)."""
    groups, balance = _groups(2), AttentionDpBalance(timeout_iters=6, batching_wait_iters=0)
    assert _step(balance, groups) == [False, False] and _step(balance, groups) == [False, False]
    groups[0].add(Request(10, 0.0, input_len=300, output_len=10))
    ran = [_step(balance, groups) for _ in range(5)]
    assert ran[:3] == [[False, False]] * 3 and ran[3] == [True, False]  # count 3, 4, 5 held; 6 runs it


def test_attention_dp_runs_at_once_when_every_rank_has_a_prompt_after_the_batching_wait():
    groups, balance = _groups(2), AttentionDpBalance(timeout_iters=50, batching_wait_iters=2)
    for gi, g in enumerate(groups):
        g.add(Request(10 + gi, 0.0, input_len=300, output_len=10))
    assert [_step(balance, groups) for _ in range(3)] == [[False, False], [False, False], [True, True]]


def test_attention_dp_never_waits_with_an_idle_rank():
    groups = _groups(2)
    groups[1].running.clear()  # rank 1 decodes nothing: no dead waiting
    balance = AttentionDpBalance(timeout_iters=50, batching_wait_iters=10)
    groups[0].add(Request(10, 0.0, input_len=300, output_len=10))
    assert _step(balance, groups) == [True, False]


@pytest.mark.parametrize("start, steps, timeout", [(0, 7, 5), (3, 1, 5), (4, 20, 6), (2, 3, 0)])
def test_a_folded_decode_run_ticks_the_count_as_step_by_step(start, steps, timeout):
    groups = _groups(2)
    stepped, folded = AttentionDpBalance(timeout, 0), AttentionDpBalance(timeout, 0)
    stepped.waiting = folded.waiting = start
    for _ in range(steps):
        stepped.apply([g.schedule(set()) for g in groups], groups)
    folded.decode_steps(steps, all_gen=True)
    assert folded.waiting == stepped.waiting


@pytest.mark.parametrize("arrival", ["closed", "poisson"])
def test_fast_path_equals_reference_with_attention_dp_balancing(arrival):
    ctx = CostContext(get_model("deepseek-v2-lite"), Workload(precision="fp8"), Cluster.simple("h200", 8))
    plan = ServingPlan.aggregated(megatron_strategy(tp=2, ep=2), workers=1, max_num_seqs=16)
    rt = get_runtime("trtllm").with_overrides(attention_dp_balance=True, attention_dp_timeout_iters=9,
                                              attention_dp_batching_wait_iters=2)
    cfg = _cfg(arrival=arrival, rate=30.0)
    runs = [simulate_serving(ctx, plan, cfg, runtime=rt, fast=f) for f in (True, False)]
    key = [(r.steps, r.metrics.ttft_s["mean"], r.metrics.tpot_s["mean"], r.metrics.e2e_s["p90"]) for r in runs]
    assert key[0] == pytest.approx(key[1], rel=1e-9)
    off = simulate_serving(ctx, plan, cfg, runtime=get_runtime("trtllm"))
    assert runs[0].metrics.ttft_s["mean"] > off.metrics.ttft_s["mean"]  # holding prompts costs TTFT


def test_bad_attention_dp_balancing_names_the_field():
    with pytest.raises(ServingInputError, match="attention_dp_timeout_iters"):
        get_runtime("trtllm").with_overrides(attention_dp_timeout_iters=-1)
    with pytest.raises(ServingInputError, match="TensorRT-LLM"):
        get_runtime("sglang").with_overrides(attention_dp_balance=True)
