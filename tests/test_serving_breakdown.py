"""A serving step's breakdown: its parts add up to the simulator's own step time, and the run's stats."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.moe import RoutingConfig
from simcore.serving import (
    GroupBatch,
    LengthDist,
    Pool,
    ServingConfig,
    ServingPlan,
    StepCost,
    get_runtime,
    simulate_serving,
)
from simcore.serving.breakdown import PARTS, mean_decode_batches, step_breakdown
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload

ADJUST = ("CUDA graph replay", "eager launch floor")


def _ctx(model: str, gpus: int = 8, routing=None):
    return CostContext(get_model(model), Workload(precision="fp8"), Cluster.simple("h200", gpus), routing=routing)


def _decodes(seqs: int, context: int, groups: int = 1, q: int = 1) -> list[GroupBatch]:
    return [GroupBatch([], seqs, float(seqs * context), seqs * q, q) for _ in range(groups)]


# (model, strategy, moe_ep, runtime, groups of the step, routing): decodes and prompt chunks, dense and MoE,
# attention DP, a hybrid and a sparse-attention model, two pipeline stages, speculative drafts
CASES = [
    ("llama-3.1-70b", megatron_strategy(tp=4), 1, "vllm", _decodes(32, 1500), None),
    ("llama-3.1-70b", megatron_strategy(tp=4, pp=2), 1, "trtllm", _decodes(16, 3000), None),
    ("llama-3.1-70b", megatron_strategy(tp=8), 1, "sglang", [GroupBatch.of([(2048, 0)], [], 1)], None),
    ("deepseek-v3", megatron_strategy(tp=8), 1, "sglang", _decodes(8, 2000), RoutingConfig(sampled=True)),
    ("deepseek-v3", megatron_strategy(tp=1, ep=8), 1, "sglang", _decodes(4, 2000, groups=8), RoutingConfig()),
    ("deepseek-v3", megatron_strategy(tp=8), 1, "trtllm", [GroupBatch.of([(1024, 0)], [1100] * 6, 7)], None),
    ("qwen3-235b-a22b", megatron_strategy(tp=4), 2, "vllm", _decodes(64, 1200), None),
    ("qwen3.5-397b-a17b", megatron_strategy(tp=8), 1, "sglang", _decodes(16, 5000), None),
    ("glm-5", megatron_strategy(tp=8), 1, "sglang", _decodes(8, 9000), None),
    ("gpt-oss-120b", megatron_strategy(tp=2), 1, "trtllm-spec3", _decodes(8, 2000, q=4), None),
]


def _runtime(name: str):
    if name == "trtllm-spec3":
        return dataclasses.replace(get_runtime("trtllm"), spec_tokens=3, spec_accept=(0.8, 0.6, 0.4))
    return get_runtime(name)


@pytest.mark.parametrize("model, strategy, moe_ep, runtime, groups, routing", CASES)
def test_parts_add_up_to_the_step(model, strategy, moe_ep, runtime, groups, routing):
    """Before the graph / eager adjustment the parts sum to StepCost.stage_times (priced by its own
    path, task totals and the mixers' max), and with it to gpu_times, the simulator's step."""
    rt = _runtime(runtime)
    cost = StepCost(_ctx(model, routing=routing), strategy, rt, moe_ep)
    b = step_breakdown(cost, groups, rt)
    assert set(b.parts) <= set(PARTS)
    kernels = sum(v for k, v in b.parts.items() if k not in ADJUST)
    assert kernels == pytest.approx(sum(cost.stage_times(groups)[0]), rel=1e-12)
    assert sum(b.parts.values()) == pytest.approx(b.gpu_s, rel=1e-12)
    assert b.gpu_s == pytest.approx(sum(cost.gpu_times(groups, rt)), rel=1e-15)
    assert b.parts.get("attention", 0) > 0 and b.parts.get("GEMMs", 0) > 0
    if get_model(model).is_moe:
        assert b.parts["routed experts"] > 0
        assert b.parts.get("MoE fixed time (fitted)", 0) == pytest.approx(cost.model.num_moe_layers * rt.moe_layer_s)
    assert ("linear attention" in b.parts) == get_model(model).is_hybrid
    assert ("speculative drafts" in b.parts) == (rt.spec_tokens > 0)
    assert ("communication" in b.parts) == (strategy.tp > 1 or strategy.ep > 1 or strategy.pp > 1)
    if any(g.chunks for g in groups) and rt.graph_decode_only:
        assert "CUDA graph replay" not in b.parts
    elif b.tokens <= rt.graph_max_tokens:
        assert b.parts["CUDA graph replay"] < 0


def test_host_or_gpu_sets_the_pace():
    """An overlapping runtime's steps start max(gpu, host) apart, a synchronous one's gpu + host."""
    groups = _decodes(4, 1000)
    cost = StepCost(_ctx("llama-3.1-8b", gpus=1), megatron_strategy(tp=1), get_runtime("vllm"))
    slow_host = dataclasses.replace(get_runtime("vllm"), step_host_s=0.05)
    b = step_breakdown(cost, groups, slow_host)
    assert (b.bound, b.step_s, b.host_s) == ("host", pytest.approx(0.05 + 4 * slow_host.step_host_per_seq_s),
                                            pytest.approx(0.05 + 4 * slow_host.step_host_per_seq_s))
    sync = get_runtime("vllm-sync")
    b = step_breakdown(cost, groups, sync)
    assert b.bound == "gpu" and b.step_s == pytest.approx(b.gpu_s + sync.host_s(4))
    fast_host = dataclasses.replace(get_runtime("vllm"), step_host_s=0.0, step_host_per_seq_s=0.0)
    b = step_breakdown(cost, groups, fast_host)
    assert (b.bound, b.step_s) == ("gpu", b.gpu_s)
    with pytest.raises(ValueError, match="no tokens"):
        step_breakdown(cost, [GroupBatch([], 0, 0.0, 0)], sync)


def test_mean_decode_batches():
    assert mean_decode_batches({"decode_steps": 0}, 2) == []
    stats = {"decode_steps": 10, "mean_decode_seqs": 5.6, "mean_decode_context": 1200.0}
    batches = mean_decode_batches(stats, 2, decode_q=2)
    assert [(g.decode_seqs, g.decode_context_sum, g.sampled, g.decode_q) for g in batches] == [(6, 7200.0, 12, 2)] * 2


def test_pool_stats_of_a_closed_loop_run():
    """Fixed lengths, clients fewer than the batch limit: every pure-decode step runs the clients still
    decoding, so the mean sits below the clients and above 0; contexts between prompt and prompt + output;
    the GPUs are busy part of the time; a disaggregated prefill pool takes no decode step."""
    ctx = _ctx("llama-3.1-8b")
    cfg = ServingConfig(concurrency=8, num_requests=40, input_len=LengthDist("fixed", mean=500),
                        output_len=LengthDist("fixed", mean=100))
    agg = simulate_serving(ctx, ServingPlan.aggregated(megatron_strategy(tp=1), workers=1, max_num_seqs=64), cfg)
    s = agg.pool_stats["both"]
    assert s["workers"] == 1 and 0 < s["gpu_busy_share"] <= 1
    assert 0 < s["decode_steps"] < agg.steps and 1 <= s["mean_decode_seqs"] <= 8
    assert 500 < s["mean_decode_context"] < 600
    dis = simulate_serving(ctx, ServingPlan.disaggregated(Pool(megatron_strategy(tp=1), 1, 16),
                                                          Pool(megatron_strategy(tp=1), 1, 64)), cfg)
    assert dis.pool_stats["prefill"]["decode_steps"] == 0 and dis.pool_stats["decode"]["decode_steps"] > 0
    assert json.loads(json.dumps(dis.to_dict()))["pools"] == dis.pool_stats


def _row_csv(tmp_path, **changes):
    """A two-row CSV in the serving schema: a small dense model on vLLM (fast to simulate), and a
    disaggregated row without worker counts (which the study skips)."""
    import csv

    cols = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision", "mode",
            "isl", "osl", "batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
            "prefill_tp_size", "decode_tp_size", "silicon_ttft_ms", "silicon_tpot_ms"]
    agg = {"id": "small", "silicon_data_source": "silicon_concurrency=4; x", "backend": "vllm",
           "backend_version": "0.16.0", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "system": "h200_sxm",
           "precision": "fp8", "mode": "agg", "isl": "256", "osl": "16", "batch_size": "4", "tp_size": "1",
           "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "1",
           "silicon_ttft_ms": "40", "silicon_tpot_ms": "5"} | changes
    dis = agg | {"id": "nosize", "mode": "disagg", "prefill_tp_size": "1", "decode_tp_size": "1"}
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows([agg, dis])
    return path


def test_explain_serving_cli(tmp_path, capsys):
    """The row is simulated as the study simulates it (same TPOT as simulate_case) and its mean decode
    step printed and returned, parts adding up; bad input is one line, exit 2."""
    import subprocess
    import sys

    from validation.studies.serving import load_cases, simulate_case
    from validation.studies.serving.explain import main

    data = _row_csv(tmp_path)
    out = main(["small", "--data", str(data)])["small"]
    _ttft, tpot, _why = simulate_case(load_cases(data)[0])
    assert out["sim_tpot_ms"] == pytest.approx(tpot * 1e3, rel=1e-12) and out["measured_tpot_ms"] == 5.0
    step = out["steps"]["both"]
    assert sum(step["parts_ms"].values()) == pytest.approx(step["gpu_ms"], rel=1e-9)
    assert 1 <= step["sequences"] <= 4 and 256 * 0.8 < step["mean_decode_context"] < 256 + 16
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"small": out}
    slow = main(["small", "--data", str(data), "--set", "step_host_s=0.05"])["small"]["steps"]["both"]
    seqs = slow["sequences"]
    assert slow["host_ms"] == pytest.approx((0.05 + seqs * get_runtime("vllm").step_host_per_seq_s) * 1e3)
    assert slow["bound"] == "host" and slow["gpu_ms"] == pytest.approx(step["gpu_ms"], rel=0.2)
    for args, word in ((["nope"], "id: nope"), (["nosize"], "skips this row"),
                       (["small", "--set", "step_host_s=-1"], "--set"), (["small", "--set", "nope=1"], "--set"),
                       (["--split", "bogus"], "--split"), (["small", "--jobs", "x"], "--jobs"),
                       (["small", "--data", str(tmp_path / "none.csv")], "--data")):
        if "--data" not in args:
            args = [*args, "--data", str(data)]
        proc = subprocess.run([sys.executable, "-m", "validation.studies.serving.explain", *args], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 2 and word in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_explain_serving_census(tmp_path):
    """--split: every row of the set the study simulates (the skipped one left out), grouped by model,
    backend and what sets the pace; its counts agree with the row's own explanation."""
    from validation.studies.serving.explain import main

    data = _row_csv(tmp_path)
    one = main(["small", "--data", str(data)])["small"]
    out = main(["--split", "fit", "--data", str(data), "--jobs", "1"])
    bound = one["steps"]["both"]["bound"]
    error = one["sim_tpot_ms"] / one["measured_tpot_ms"] - 1
    assert out["split"] == "fit" and out["rows"] == 1 and out["host_bound"] == (bound == "host")
    assert out["groups"] == {f"Llama-3.1-8B-Instruct vllm {bound}-bound": {
        "rows": 1, "median_abs_tpot_error": pytest.approx(abs(error)), "median_signed_tpot_error": pytest.approx(error),
        "within_10pct": int(abs(error) <= 0.1)}}
    assert main(["--split", "test", "--data", str(data), "--jobs", "1"])["rows"] == 0  # no test model in it


def test_app_breakdowns_of_a_seesaw_plan():
    """shard-sim's per-pool breakdowns on a seesaw plan: its decode layout's mean step (two stages), the
    parts adding up, the column named for the layout; the prefill layout takes no decode step."""
    import io

    from rich.console import Console

    from planner.apps.serve import _breakdown_table, decode_step_breakdowns

    ctx = _ctx("llama-3.1-8b")
    plan = ServingPlan.seesaw(megatron_strategy(tp=8), megatron_strategy(tp=4, pp=2))
    cfg = ServingConfig(concurrency=8, num_requests=24, input_len=LengthDist("fixed", mean=800),
                        output_len=LengthDist("fixed", mean=64))
    result = simulate_serving(ctx, plan, cfg)
    steps = decode_step_breakdowns(ctx, plan, get_runtime(cfg.runtime), result)
    assert list(steps) == ["decode"] and result.pool_stats["prefill"]["decode_steps"] == 0
    b = steps["decode"]
    assert sum(b.parts.values()) == pytest.approx(b.gpu_s, rel=1e-12) and b.parts["communication"] > 0
    out = io.StringIO()
    Console(file=out, width=120).print(_breakdown_table("t", steps, result.pool_stats, plan.mode))
    assert "decode layout" in out.getvalue() and "GPUs busy over the run" in out.getvalue()
