"""The server's frontend process (``RuntimeProfile.frontend_token_s``, :mod:`simcore.serving.frontend`): a FIFO
queue of streamed tokens and new requests that delays both once the steps outrun it, and leaves the run
untouched while it keeps up."""

from __future__ import annotations

import pytest

from simcore.serving import (
    LengthDist,
    ServingConfig,
    ServingInputError,
    ServingPlan,
    get_runtime,
    simulate_serving,
)
from simcore.serving.frontend import Frontend
from simcore.strategy.sharding import megatron_strategy


def _ctx():
    from tests.test_serving import _ctx as ctx

    return ctx()


def _run(token_s: float, osl: int, clients: int = 64, fast: bool = True, runtime: str = "sglang"):
    plan = ServingPlan.aggregated(megatron_strategy(tp=1), 1, clients)
    cfg = ServingConfig(concurrency=clients, num_requests=3 * clients, runtime=runtime,
                        input_len=LengthDist(mean=256), output_len=LengthDist(mean=osl))
    rt = get_runtime(runtime).with_overrides(frontend_token_s=token_s, request_s=0.0, tokenize_s_per_token=0.0)
    return simulate_serving(_ctx(), plan, cfg, runtime=rt, fast=fast)


def test_the_queue_is_lindleys_recursion():
    """Each job ends at ``max(previous end, arrival) + its tokens x token_s``; a job arriving before the
    backlog clears waits for it; an idle frontend hands tokens on at once."""
    fe = Frontend(1e-3)
    assert fe.emit(0.0, 10) == pytest.approx(0.010)
    assert fe.backlog_s(0.004) == pytest.approx(0.006)
    assert fe.emit(0.005, 5) == pytest.approx(0.015)  # waits for the first job
    assert fe.emit(0.100, 1) == pytest.approx(0.101)  # idle by then
    assert fe.backlog_s(0.2) == 0.0
    assert fe.busy_s == pytest.approx(0.016) and fe.tokens == 16
    assert Frontend(0.0).emit(0.3, 100) == 0.3  # off: tokens reach their clients as the step ends
    with pytest.raises(ValueError, match="frontend_token_s"):
        Frontend(-1.0)
    with pytest.raises(ServingInputError, match="frontend_token_s"):
        get_runtime("vllm").with_overrides(frontend_token_s=-1e-6)
    with pytest.raises(ServingInputError, match="serving.frontend_token_us"):
        ServingConfig(frontend_token_s=-1e-6)


def test_a_frontend_that_keeps_up_changes_only_the_last_hop():
    """Far below the steps' token rate, each token reaches its client at most one step's stream later:
    TTFT and TPOT move by less than a few tokens' streaming time."""
    base, slow = _run(0.0, 64), _run(1e-7, 64)
    assert slow.metrics.ttft_s["mean"] == pytest.approx(base.metrics.ttft_s["mean"], abs=64 * 1e-7 * 3)
    assert slow.metrics.tpot_s["mean"] == pytest.approx(base.metrics.tpot_s["mean"], rel=1e-3)


def test_a_saturated_frontend_bounds_what_the_clients_see():
    """When the steps emit tokens faster than the frontend streams them (64 clients of a small model against
    5,000 tokens/s): the clients see at most one token per ``frontend_token_s``, each token later than the
    step made it (TPOT up), and no request sooner than without a frontend (TTFT not down)."""
    per_token = 2e-4
    for osl in (32, 128):
        free, slow = _run(0.0, osl), _run(per_token, osl)
        assert free.metrics.output_tokens_per_s > 1.0 / per_token  # the steps alone would outrun it
        assert slow.metrics.output_tokens_per_s <= 1.0 / per_token * 1.01
        assert slow.metrics.tpot_s["mean"] > 2.0 * free.metrics.tpot_s["mean"]
        assert slow.metrics.ttft_s["mean"] >= free.metrics.ttft_s["mean"]


@pytest.mark.parametrize("runtime", ["vllm", "sglang", "trtllm"])
def test_fast_loop_equals_the_reference_with_a_frontend(runtime):
    """With a frontend the single-stage loop takes every step on its own (no folded decode runs), and gives
    what the reference loop (every step a process through the pipeline stages) gives."""
    fast, ref = _run(1e-4, 48, clients=32, runtime=runtime), _run(1e-4, 48, clients=32, fast=False, runtime=runtime)
    assert fast.metrics.ttft_s["mean"] == pytest.approx(ref.metrics.ttft_s["mean"], rel=1e-9)
    assert fast.metrics.tpot_s["mean"] == pytest.approx(ref.metrics.tpot_s["mean"], rel=1e-9)
