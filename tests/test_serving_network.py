"""Serving steps on the network (simcore/serving/fabric.py): idle fabric == closed form, contention
slows steps down, proxy-equivalent keeps today's figures, DeepEP's mode per step, two-batch overlap."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simcore.serving import LengthDist, ServingConfig, ServingPlan, simulate_serving
from simcore.serving.deployment import LaunchFlags
from simcore.serving.plan import Pool, runtime_strategy
from simcore.serving.requests import ServingInputError
from simcore.serving.runtime import get_runtime
from simcore.serving.step_cost import GroupBatch, StepCost, batch_halves, two_batch_overlap_s
from topologies.presets import build_topology
from validation.studies.common.scenarios import scenario_context


@pytest.fixture(scope="module")
def ctx():
    return scenario_context("deepseek-8node")  # DeepSeek-V3 on 8 nodes of H100


def _cfg(n: int, concurrency: int, osl: int = 64) -> ServingConfig:
    return ServingConfig(concurrency=concurrency, num_requests=n, runtime="sglang-deepep",
                         input_len=LengthDist(mean=512), output_len=LengthDist(mean=osl))


def _two_ep_workers() -> ServingPlan:
    """Two aggregated workers, each EP16 over 2 nodes: their exchanges share the fabric's spines."""
    return ServingPlan("agg", pool=Pool(runtime_strategy(tp=1, ep=16), 2, 256))


def _same(a, b) -> None:
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert getattr(a.metrics, key)["mean"] == pytest.approx(getattr(b.metrics, key)["mean"], rel=1e-9, abs=1e-12)


def test_an_idle_fabric_gives_exactly_the_closed_form(ctx):
    """One request on a plan whose exchanges run as flows: nothing else is in flight, so every folded
    step takes exactly its closed form."""
    graph = build_topology("h100-ib-rail", num_nodes=4)
    flows = simulate_serving(ctx, _two_ep_workers(), _cfg(1, 1), graph=graph)
    closed = simulate_serving(ctx, _two_ep_workers(), _cfg(1, 1))
    assert flows.network["flows"] > 0 and flows.network["step_flows"] == {"both": ["ep"]}
    assert flows.network["network_wait_share"] == pytest.approx(0.0, abs=1e-9)
    _same(flows, closed)


def test_proxy_equivalent_keeps_todays_figures(ctx):
    """``contention=False`` (``sim=proxy-equivalent``): every step in closed form, as without a graph."""
    graph = build_topology("h100-ib-rail", num_nodes=4)
    off = simulate_serving(ctx, _two_ep_workers(), _cfg(64, 32), graph=graph, contention=False)
    closed = simulate_serving(ctx, _two_ep_workers(), _cfg(64, 32))
    assert off.network["flows"] == 0 and off.network["step_flows"] == {}
    _same(off, closed)


def test_two_workers_under_an_oversubscribed_spine_wait_on_each_other(ctx):
    graph = build_topology("h100-ib-rail", num_nodes=4, oversubscription=8.0)
    flows = simulate_serving(ctx, _two_ep_workers(), _cfg(64, 64), graph=graph)
    closed = simulate_serving(ctx, _two_ep_workers(), _cfg(64, 64))
    net = flows.network
    assert net["flows"] > 0 and net["network_wait_share"] > 0
    assert net["bytes"]["leaf_spine"] > 0 and net["busiest_link"] is not None
    assert 0 < net["busiest_utilization"] <= 1
    assert flows.metrics.tpot_s["mean"] > closed.metrics.tpot_s["mean"]


def test_one_worker_across_an_oversubscribed_spine_waits_for_it(ctx):
    """One EP64 worker over two leaves of a 4:1 fat tree, one request: nothing else is in flight, yet its
    exchanges cross the spine the closed form does not see, and the step waits for it."""
    plan = ServingPlan("agg", pool=Pool(runtime_strategy(tp=1, ep=64), 1, 256))
    flows = simulate_serving(ctx, plan, _cfg(1, 1, osl=8), graph=build_topology("h100-ib-fattree", num_nodes=8,
                                                                                  oversubscription=4.0))
    blocking = simulate_serving(ctx, plan, _cfg(1, 1, osl=8), graph=build_topology("h100-ib-fattree", num_nodes=8))
    closed = simulate_serving(ctx, plan, _cfg(1, 1, osl=8))
    assert flows.network["step_flows"] == {"both": ["ep"]} and flows.network["network_wait_share"] > 0
    assert flows.metrics.tpot_s["mean"] > blocking.metrics.tpot_s["mean"] >= closed.metrics.tpot_s["mean"] * (1 - 1e-9)
    assert flows.pool_stats["both"]["network_wait_s_per_step"] > 0 == closed.pool_stats["both"]["network_wait_s_per_step"]


def test_decode_steps_run_deepeps_low_latency_kernels(ctx):
    runtime = get_runtime("sglang-deepep")
    cost = StepCost(ctx, runtime_strategy(tp=1, ep=32), runtime)
    algorithms = {mode: {t.extra.get("algorithm") for t in cost.block_tasks(64, 64, mode == "decode")["moe_layer"]
                         if t.group == "ep"} for mode in ("prefill", "decode")}
    assert algorithms == {"prefill": {"deepep_normal"}, "decode": {"deepep_low_latency"}}
    decode = [GroupBatch.of([], [1000] * 16, 16) for _ in range(32)]
    prefill = [GroupBatch.of([(16, 0)], [], 1) for _ in range(32)]
    assert cost.step_key(decode)[2] and not cost.step_key(prefill)[2]
    assert cost.stage_comm(decode)[0]["ep"] != cost.stage_comm(prefill)[0]["ep"]  # memo keyed on the mode


def test_two_batch_overlap_hides_the_exchanges_of_a_large_batch(ctx):
    plain = get_runtime("sglang-deepep")
    tbo = plain.with_overrides(two_batch_overlap=True)
    strategy = runtime_strategy(tp=1, ep=32)
    for batch in ([GroupBatch.of([], [2000] * 256, 256)] * 32, [GroupBatch.of([(8192, 0)], [], 1)] * 32):
        cost = StepCost(ctx, strategy, plain)
        t_plain, t_tbo = sum(cost.gpu_times(batch, plain)), sum(cost.gpu_times(batch, tbo))
        halves = [batch_halves(g) for g in batch]
        ep_halves = [cost.stage_comm([h[i] for h in halves])[0]["ep"] for i in (0, 1)]
        assert min(ep_halves) > 0 and t_tbo < t_plain
        compute, exchange = cost.overlap_parts(batch, tbo)[0]
        assert exchange == pytest.approx(sum(ep_halves))
        # two micro-batches compute at least what the whole batch does (weights read twice, half the rows)
        assert compute >= sum(cost.gpu_parts(batch, plain)) - cost.stage_comm(batch)[0]["ep"]
        assert t_tbo == pytest.approx(two_batch_overlap_s(compute, exchange, cost.moe_layers[0]))


def test_a_batch_splits_into_halves_that_add_up_to_it():
    a, b = batch_halves(GroupBatch.of([(7, 100), (4, 0)], [10, 20, 30], 4))
    assert a.chunks == [(4, 100), (2, 0)] and b.chunks == [(3, 104), (2, 2)]
    assert (a.decode_seqs + b.decode_seqs, a.decode_context_sum + b.decode_context_sum) == (3, 60.0)
    assert (a.sampled, b.sampled) == (2, 2)


def test_two_batch_overlap_slows_a_small_memory_bound_decode(ctx):
    """At 32 sequences per GPU each micro-batch reads every expert's weights again: TBO costs more than
    the exchanges it hides, as SGLang's guidance to enable it for large batches says."""
    plain = get_runtime("sglang-deepep")
    tbo = plain.with_overrides(two_batch_overlap=True)
    cost = StepCost(ctx, runtime_strategy(tp=1, ep=32), plain)
    batch = [GroupBatch.of([], [2000] * 32, 32)] * 32
    assert sum(cost.gpu_times(batch, tbo)) > sum(cost.gpu_times(batch, plain))


def test_two_batch_overlap_on_a_runtime_without_it_is_refused():
    with pytest.raises(ServingInputError, match=r"^serving\.two_batch_overlap: .*runtime vllm"):
        LaunchFlags(two_batch_overlap=True).apply(get_runtime("vllm"))
    assert LaunchFlags(two_batch_overlap=True).apply(get_runtime("sglang")).two_batch_overlap


def test_shard_sim_refuses_two_batch_overlap_on_vllm_with_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from planner.apps.sim import main; main()",
                           "experiment=dense-70b-1node", "workload=serving", "serving.runtime=vllm",
                           "serving.two_batch_overlap=true", f"hydra.run.dir={tmp_path}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: serving.two_batch_overlap"), proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_where_nothing_is_shared_the_skipped_flows_would_give_the_closed_form(ctx, monkeypatch):
    """The fast path: a kind whose links nobody else uses keeps its closed form and skips the flow solver.
    Forced onto the network (every kind with links), the same loaded run gives the same figures, so the
    skip changes nothing where it is taken. One EP32 worker on four nodes under one leaf of a fat tree."""
    from simcore.serving import fabric

    plan = ServingPlan("agg", pool=Pool(runtime_strategy(tp=1, ep=32), 1, 256))
    graph = build_topology("h100-ib-fattree", num_nodes=4)
    skipped = simulate_serving(ctx, plan, _cfg(48, 24), graph=graph)
    assert skipped.feasible and skipped.network["flows"] == 0  # nothing shared: closed form, no flow solver

    def everything(self, others):
        for (kind, p), sets in self.links.items():
            if set().union(*sets):
                self.kinds[p].add(kind)

    monkeypatch.setattr(fabric.WorkerFabric, "decide", everything)
    forced = simulate_serving(ctx, plan, _cfg(48, 24), graph=graph)
    assert forced.network["flows"] > 0 and forced.network["step_flows"] == {"both": ["ep"]}
    _same(forced, skipped)
