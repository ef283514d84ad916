"""The serving trace (simcore.serving.trace): Chrome trace JSON that Perfetto loads, recorded without changing a run."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import (
    LengthDist,
    Pool,
    ServingConfig,
    ServingPlan,
    ServingTrace,
    runtime_strategy,
    simulate_serving,
    write_serving_trace,
)
from simcore.workload import Workload
from tests.conftest import run_app
from topologies import build_topology


def _ctx(gpus=8):
    return CostContext(get_model("llama-3.1-8b"), Workload(precision="fp8"), Cluster.simple("h200", gpus))


def _cfg(**kw):
    base = dict(concurrency=16, num_requests=40, input_len=LengthDist("uniform", mean=600, low=200, high=3000),
                output_len=LengthDist("uniform", mean=60, low=20, high=120), seed=1)
    return ServingConfig(**(base | kw))


def _load(tmp_path, trace: ServingTrace) -> list[dict]:
    path = write_serving_trace(tmp_path / "trace.json", trace)
    return json.loads(path.read_text())["traceEvents"]


def _check_well_formed(events: list[dict]) -> None:
    """Metadata first, then times in order; spans of a track never overlap (Perfetto nests them)."""
    assert all(e["ph"] in ("M", "X", "C") for e in events)
    timed = [e for e in events if e["ph"] != "M"]
    assert events[: len(events) - len(timed)] == [e for e in events if e["ph"] == "M"]
    ts = [e["ts"] for e in timed]
    assert ts == sorted(ts) and ts[0] >= 0
    tracks = defaultdict(list)
    for e in timed:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            tracks[e["pid"], e["tid"]].append(e)
    for spans in tracks.values():
        assert all(b["ts"] >= a["ts"] + a["dur"] - 1e-6 for a, b in zip(spans, spans[1:], strict=False))


def test_an_aggregated_run_traces_requests_steps_and_counters_in_microseconds(tmp_path):
    ctx, cfg = _ctx(), _cfg(runtime="vllm")
    plan = ServingPlan.aggregated(runtime_strategy(tp=2), workers=2, max_num_seqs=8)
    plain = simulate_serving(ctx, plan, cfg)
    trace = ServingTrace(requests=8)
    traced = simulate_serving(ctx, plan, cfg, trace=trace)
    assert traced.metrics.to_dict() == plain.metrics.to_dict()  # recording changes nothing
    events = _load(tmp_path, trace)
    _check_well_formed(events)
    spans = [e for e in events if e["ph"] == "X"]
    requests = [e for e in spans if e["cat"] == "request"]
    assert {e["tid"] for e in requests} == {0, 5, 10, 15, 20, 25, 30, 35}  # 8 of 40, spread over the run
    assert {"queued", "prefill", "decode"} <= {e["name"] for e in requests}
    steps = [e for e in spans if e["cat"] == "step"]
    assert {e["tid"] for e in steps} == {0, 64}  # worker 0 and worker 1 (tid = 64 x worker + stage)
    assert all({"seqs", "prefill_tokens", "decode_tokens"} <= set(e["args"]) for e in steps)
    assert sum(e["args"]["prefill_tokens"] * e["args"].get("steps", 1) for e in steps) >= 40 * 200
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"requests", "KV blocks", "tokens per step"} <= counters
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"requests", "pool", "request 0", "worker 0 (tp2 ep1 pp1)"} <= names
    # request 0: queued from 0 (the runtime's request path), its prompt in chunks, then its decode, last
    mine = [e for e in requests if e["tid"] == 0]
    assert mine[0]["name"] == "queued" and mine[0]["ts"] == 0 and mine[-1]["name"] == "decode"
    assert sum(e["args"]["tokens"] for e in mine if e["name"] == "prefill") >= 200


def test_requests_zero_keeps_the_steps_and_all_gives_every_request_a_track(tmp_path):
    ctx, cfg = _ctx(), _cfg(num_requests=20)
    plan = ServingPlan.aggregated(runtime_strategy(tp=1), max_num_seqs=8)
    none, every = ServingTrace(requests=0), ServingTrace(requests=-1)
    simulate_serving(ctx, plan, cfg, trace=none)
    result = simulate_serving(ctx, plan, cfg, trace=every)
    none_events, every_events = _load(tmp_path, none), _load(tmp_path, every)
    assert not [e for e in none_events if e.get("cat") == "request"]
    assert [e for e in none_events if e.get("cat") == "step"]
    tracks = defaultdict(list)
    for e in every_events:
        if e.get("cat") == "request":
            tracks[e["tid"]].append(e)
    assert set(tracks) == set(range(20))
    # microseconds: a request's track runs from its arrival (queued) to its last token (decode's end)
    e2e_us = [max(e["ts"] + e["dur"] for e in t) - min(e["ts"] for e in t) for t in tracks.values()]
    assert sum(e2e_us) / len(e2e_us) == pytest.approx(result.metrics.e2e_s["mean"] * 1e6, rel=1e-6)
    with pytest.raises(ValueError, match="serving.trace_requests must be an integer >= -1, got -2"):
        ServingTrace(requests=-2)


def test_a_preempted_request_shows_its_preemption(tmp_path):
    """KV for a few requests only: vLLM preempts the newest, which recompute; each shows it."""
    ctx, cfg = _ctx(), _cfg(concurrency=32, num_requests=48, input_len=LengthDist(mean=2000),
                            output_len=LengthDist(mean=400))
    plan = ServingPlan.aggregated(runtime_strategy(tp=1), max_num_seqs=32)
    trace = ServingTrace(requests=-1)
    result = simulate_serving(ctx, plan, replace(cfg, mem_fraction=0.1), trace=trace)  # 14k tokens of KV
    assert result.metrics.preemptions > 0
    events = _load(tmp_path, trace)
    _check_well_formed(events)
    preempted = [e for e in events if e.get("name") == "preempted"]
    assert preempted and all(e["dur"] > 0 for e in preempted)


def test_disaggregated_hand_offs_are_spans_and_their_links_counters(tmp_path):
    ctx = _ctx()
    graph = build_topology("h200-ib-rail", num_nodes=1)
    plan = ServingPlan.disaggregated(Pool(runtime_strategy(tp=1), 1, 16), Pool(runtime_strategy(tp=2), 2, 32))
    trace = ServingTrace(requests=-1)
    result = simulate_serving(ctx, plan, _cfg(), graph=graph, trace=trace)
    assert result.feasible
    events = _load(tmp_path, trace)
    _check_well_formed(events)
    handoffs = [e for e in events if e.get("name") == "kv hand-off"]
    assert len(handoffs) == 40 and all(e["dur"] > 0 and e["args"]["bytes"] > 0 for e in handoffs)
    links = [e for e in events if e["ph"] == "C" and e["pid"] == 99]
    assert links and all(0 <= e["args"]["utilization"] <= 1 + 1e-9 for e in links)
    pools = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"prefill pool", "decode pool", "links (KV hand-off flows)"} <= pools


def test_a_pipelined_run_over_its_step_budget_folds_steps_into_counted_spans(tmp_path):
    ctx, cfg = _ctx(), _cfg()
    plan = ServingPlan.aggregated(runtime_strategy(tp=1, pp=2), max_num_seqs=16)
    full, small = ServingTrace(requests=4), ServingTrace(requests=4, max_steps=50, max_samples=40)
    simulate_serving(ctx, plan, cfg, trace=full)
    simulate_serving(ctx, plan, cfg, trace=small)
    full_events, small_events = _load(tmp_path, full), _load(tmp_path, small)
    _check_well_formed(small_events)

    def steps(events):
        spans = [e for e in events if e.get("cat") == "step"]
        return len(spans), {tid: sum(e["args"].get("steps", 1) for e in spans if e["tid"] == tid) for tid in (0, 1)}

    (n_full, per_stage_full), (n_small, per_stage_small) = steps(full_events), steps(small_events)
    assert n_small <= 50 < n_full
    assert per_stage_small == per_stage_full  # every step still counted, on each stage's track
    assert len([e for e in small_events if e["ph"] == "C"]) <= 40 + 3


def test_shard_sim_serving_writes_result_and_trace(tmp_path):
    """``shard-sim workload=serving`` with nothing else: exit 0, a feasible plan, TTFT and TPOT in
    result.json, a trace.json with request spans and counters."""
    proc = run_app("sim", "workload=serving", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["plan_source"].startswith("no plan given: simulating one worker of tp8 ep2 pp1")
    metrics = result["result"]["metrics"]
    assert metrics["ttft_ms"]["mean"] > 0 and metrics["tpot_ms"]["mean"] > 0
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert [e for e in events if e.get("cat") == "request" and e["name"] == "decode"]
    assert {"requests", "KV blocks", "tokens per step"} <= {e["name"] for e in events if e["ph"] == "C"}
    assert "trace.json" in proc.stdout


def test_a_serving_search_refuses_the_trace_option(tmp_path):
    proc = run_app("search", "workload=serving", "serving.trace_requests=5", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: serving.trace_requests: the serving trace is "
                                                           "shard-sim's"), proc.stderr
