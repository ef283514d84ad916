"""Speculative decoding (MTP / EAGLE drafts verified by the target model) in the serving simulator."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.export.serving import serving_launch
from simcore.models import get_model
from simcore.serving import (
    GroupBatch,
    LengthDist,
    ServingConfig,
    ServingInputError,
    ServingPlan,
    StepCost,
    get_runtime,
    runtime_strategy,
    simulate_serving,
)
from simcore.serving.requests import Request
from simcore.serving.speculative import DEFAULT_ACCEPT, emitted, tokens_per_step
from simcore.workload import Workload


def _ctx(model="deepseek-v3", gpus=8):
    return CostContext(get_model(model), Workload(precision="fp8"), Cluster.simple("h200", gpus))


def test_tokens_per_step_is_the_expected_accepted_prefix_plus_one():
    assert tokens_per_step(0, DEFAULT_ACCEPT) == 1.0
    assert tokens_per_step(1, DEFAULT_ACCEPT) == pytest.approx(1.85)
    assert tokens_per_step(3, DEFAULT_ACCEPT) == pytest.approx(1 + 0.85 + 0.85 * 0.3)  # third draft never kept
    assert tokens_per_step(2, (1.0, 1.0)) == 3.0


def test_carried_fractions_emit_the_expected_tokens_exactly_and_never_past_the_output():
    req = Request(0, 0.0, 10, 10_000)
    counts = [emitted(req, 1.85) for _ in range(1000)]
    assert set(counts) == {1, 2} and sum(counts) == pytest.approx(1850, abs=1)
    short = Request(1, 0.0, 10, 3)
    short.generated = 2
    assert emitted(short, 2.5) == 1


@pytest.mark.parametrize("kwargs,field", [({"spec_tokens": -1}, "spec_tokens"), ({"spec_tokens": 6}, "spec_accept"),
                                          ({"spec_tokens": 1, "spec_accept": (1.5,)}, "spec_accept")])
def test_bad_speculation_is_a_one_line_error_naming_the_field(kwargs, field):
    with pytest.raises(ServingInputError, match=field):
        get_runtime("trtllm").with_overrides(**kwargs)
    with pytest.raises(ServingInputError, match=f"serving.{field}"):
        ServingConfig(runtime="trtllm", **kwargs)


def test_a_verify_step_costs_more_than_a_plain_step_and_far_less_than_its_tokens_in_plain_steps():
    """Decode at 4 sequences reads the weights either way: verifying 1 + 3 tokens per sequence and three
    draft passes add little next to the four plain steps the same tokens would take unspeculated."""
    ctx = _ctx()
    plain, spec = get_runtime("trtllm"), get_runtime("trtllm").with_overrides(spec_tokens=3)
    cost = StepCost(ctx, runtime_strategy(tp=8), plain)
    scost = StepCost(ctx, runtime_strategy(tp=8), spec)
    one = sum(cost.gpu_times([GroupBatch.of([], [2000] * 4, 4)], plain))
    verify = sum(scost.gpu_times([GroupBatch.of([], [2000] * 4, 16, 4)], spec))
    assert one < verify < 2.0 * one
    draft_s, kernels = scost.draft([GroupBatch.of([], [2000] * 4, 16, 4)])
    assert draft_s > 0 and kernels > 0
    assert cost.draft([GroupBatch.of([], [2000] * 4, 4)]) == (0.0, 0)  # no speculation, no drafts


def test_trtllm_and_sglang_key_decode_graphs_by_sequences_vllm_by_tokens():
    """128 sequences verifying 4 tokens each: TensorRT-LLM's graphs for batch 128 replay (no launch floor),
    vLLM's capture sizes count the 512 tokens."""
    ctx = _ctx()
    batch = [GroupBatch.of([], [2000] * 128, 512, 4)]
    for name, graph in (("trtllm", True), ("sglang", True), ("vllm", False)):
        rt = get_runtime(name).with_overrides(spec_tokens=3, graph_max_tokens=128)
        cost = StepCost(ctx, runtime_strategy(tp=8), rt)
        times, launches, tokens, _ = cost.stage_times(batch)
        eager_floor = launches * rt.launch_s
        key = tokens if name == "vllm" else batch[0].sequences
        assert rt.uses_graph(key, False) is graph
        if not graph and sum(times) < eager_floor:
            assert sum(cost.gpu_times(batch, rt)) == pytest.approx(eager_floor)


@pytest.mark.parametrize("runtime", ["vllm", "sglang", "trtllm"])
def test_speculation_generates_every_token_and_shortens_a_dense_models_tpot_at_low_load(runtime):
    ctx = _ctx("llama-3.1-70b")
    plan = ServingPlan.aggregated(runtime_strategy(tp=8), workers=1, max_num_seqs=16)
    base = dict(concurrency=4, num_requests=12, runtime=runtime, input_len=LengthDist(mean=1024),
                output_len=LengthDist("uniform", mean=200, low=100, high=300), seed=2)
    plain = simulate_serving(ctx, plan, ServingConfig(**base))
    spec = simulate_serving(ctx, plan, ServingConfig(**base, spec_tokens=3))
    assert plain.feasible and spec.feasible
    tokens = [r.metrics.output_tokens_per_s * r.metrics.duration_s for r in (plain, spec)]
    assert tokens[1] == pytest.approx(tokens[0], rel=1e-9)  # every requested token, none beyond
    assert spec.steps < plain.steps
    assert spec.metrics.tpot_s["mean"] < 0.8 * plain.metrics.tpot_s["mean"]


def test_verifying_drafts_costs_an_moe_model_more_than_a_dense_one():
    """A dense decode step reads its weights once whatever the tokens; an MoE step's extra verify tokens
    route to experts the plain step left idle, whose weights must be read too (what a roofline on
    active parameters misses)."""
    def ratio(model):
        ctx, rt = _ctx(model), get_runtime("trtllm")
        plain = sum(StepCost(ctx, runtime_strategy(tp=8), rt).stage_times([GroupBatch.of([], [1500] * 4, 4)])[0])
        spec = StepCost(ctx, runtime_strategy(tp=8), rt.with_overrides(spec_tokens=3))
        batch = [GroupBatch.of([], [1500] * 4, 16, 4)]
        return (sum(spec.stage_times(batch)[0]) - spec.draft(batch)[0]) / plain

    dense, moe = ratio("llama-3.1-70b"), ratio("deepseek-v3")
    assert 1.0 < dense < 1.1
    assert moe > dense + 0.2


def test_the_fold_is_not_taken_under_speculation_so_fast_equals_reference():
    ctx = _ctx()
    plan = ServingPlan.aggregated(runtime_strategy(tp=8), workers=1, max_num_seqs=16)
    cfg = ServingConfig(concurrency=8, num_requests=16, runtime="trtllm", spec_tokens=2,
                        output_len=LengthDist("uniform", mean=80, low=40, high=120), seed=4)
    fast = simulate_serving(ctx, plan, cfg, fast=True)
    slow = simulate_serving(ctx, plan, cfg, fast=False)
    assert (fast.steps, fast.metrics.tpot_s["mean"], fast.metrics.e2e_s["p90"]) == pytest.approx(
        (slow.steps, slow.metrics.tpot_s["mean"], slow.metrics.e2e_s["p90"]), rel=1e-9)


def test_launches_carry_the_draft_count():
    model = get_model("deepseek-v3")
    plan = ServingPlan.aggregated(runtime_strategy(tp=8), workers=1, max_num_seqs=64)
    for target, flag in (("trtllm", "num_nextn_predict_layers: 3"), ("vllm", '"num_speculative_tokens": 3'),
                         ("sglang", "--speculative-num-steps 3")):
        rt = get_runtime(target).with_overrides(spec_tokens=3)
        out = serving_launch(plan, model, target, runtime=rt)
        text = out.to_text() + "".join(out.files.values())
        assert flag in text, target
        assert "speculative" not in serving_launch(plan, model, target).to_text() + "".join(
            serving_launch(plan, model, target).files.values())


def test_a_model_without_mtp_modules_launches_an_eagle3_draft():
    from simcore.export import model_has_mtp

    assert model_has_mtp(get_model("deepseek-v3")) and model_has_mtp(get_model("qwen3.5-397b-a17b"))
    assert not model_has_mtp(get_model("llama-3.1-70b")) and not model_has_mtp(get_model("kimi-k2"))
    model = get_model("llama-3.1-70b")
    plan = ServingPlan.aggregated(runtime_strategy(tp=8), workers=1, max_num_seqs=64)
    for target, flag in (("trtllm", "decoding_type: Eagle"), ("vllm", '"method": "eagle3"'),
                         ("sglang", "--speculative-algorithm EAGLE3")):
        out = serving_launch(plan, model, target, runtime=get_runtime(target).with_overrides(spec_tokens=2))
        text = out.to_text() + "".join(out.files.values())
        assert flag in text and "EAGLE3_DRAFT_MODEL" in text, target


def test_cli_bad_acceptance_exits_2_with_one_line(tmp_path):
    cmd = [sys.executable, "-c", "from planner.apps.sim import main; main()", "workload=serving",
           "serving.spec_tokens=2", "serving.spec_accept=[0.9,2.0]", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "serving.spec_accept" in proc.stderr


def test_the_mtp_comparison_runs_both_launches_on_any_csv_and_ends_with_json(tmp_path, capsys):
    """``validation.studies.serving.speculative`` on two InferenceX DeepSeek-R1 rows measured 2026-01-14 (4 clients): both
    launches simulated, one JSON line last; with MTP their TPOT comes closer (the README's finding)."""
    import csv
    import json

    from validation.studies.serving.speculative import DATA, main

    ids = {"2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x1024_c4_tp8_0_ep8_0_1252",
           "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_agg_8192x1024_c4_tp8_0_ep8_0_1254"}
    with DATA.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if r["id"] in ids]
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=reader.fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    summary = main(["--data", str(path), "--jobs", "1"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary
    assert summary["all plain"]["rows"] == summary["all mtp"]["rows"] == 2
    assert summary["all mtp"]["tpot_median_abs"] < summary["all plain"]["tpot_median_abs"]
    published = summary["published_speedups"]
    assert [p["batch"] for p in published] == [1, 32]
    # speculation pays less as the batch grows (the verify tokens cost more GPU time), as published
    assert all(p["simulated"]["k1"] > 1.0 for p in published)
    assert published[0]["simulated"]["k1"] > published[1]["simulated"]["k1"]


def test_the_mtp_comparison_refuses_a_missing_or_foreign_csv_in_one_line(tmp_path):
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    for data, words in ((tmp_path / "none.csv", "file not found"), (foreign, "schema")):
        proc = subprocess.run([sys.executable, "-m", "validation.studies.serving.speculative", "--data", str(data)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and words in proc.stderr
