"""``shard-sim workload=serving`` without a plan simulates a feasible one: the smallest layout whose KV holds the load."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.errors import UserError
from planner.serving.config import build_serving_config, build_serving_context
from planner.serving.default_plan import candidate_layouts, default_plan
from simcore.cost.cluster import Cluster
from simcore.serving import runtime_strategy
from simcore.serving.kvcache import kv_capacity_tokens


def _cfg(*overrides: str, experiment: str = "dense-70b-1node"):
    from hydra import compose, initialize_config_module

    import planner.apps.sim  # noqa: F401  (registers sim_schema, the config group the sim app composes over)

    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="sim", overrides=[f"experiment={experiment}", "workload=serving", *overrides])


def _pick(*overrides: str, experiment: str = "dense-70b-1node"):
    cfg = _cfg(*overrides, experiment=experiment)
    ctx, scfg = build_serving_context(cfg), build_serving_config(cfg.serving)
    plan, why = default_plan(ctx, scfg)
    return ctx, scfg, plan, why


def test_the_layouts_go_fewest_gpus_first_widest_tp_first():
    ctx = build_serving_context(_cfg())  # Llama-3.1-70B (dense) on 8 H100
    layouts = candidate_layouts(ctx)
    assert layouts[:4] == [(1, 1, 1), (2, 1, 1), (1, 1, 2), (4, 1, 1)]
    assert all(e == 1 for _, e, _ in layouts)  # no expert parallelism for a dense model
    gpus = [t * e * p for t, e, p in layouts]
    assert gpus == sorted(gpus) and max(gpus) == 8


def test_llama_70b_on_h100_takes_the_smallest_tp_whose_kv_holds_the_clients():
    """64 clients of 4096 + 512 tokens: 140 GB of fp8 weights leave no KV on one 80 GB H100; tp2 holds
    them in an FP8 KV cache (vLLM's own default for this checkpoint is BF16: serving.kv_dtype); 128 clients
    outgrow tp2 (92 requests of 4608 tokens) and take tp4."""
    ctx, scfg, plan, why = _pick("serving.kv_dtype=fp8")
    rt = scfg.runtime_profile()
    assert kv_capacity_tokens(ctx, runtime_strategy(tp=1), rt) == 0
    tp2 = kv_capacity_tokens(ctx, runtime_strategy(tp=2), rt)
    assert 64 * 4608 <= tp2 < 128 * 4608
    assert plan.describe() == "agg 1x(tp2 ep1 pp1, seqs 256)"
    assert why.startswith("no plan given: simulating one worker of tp2 ep1 pp1 (2 GPUs of 8), the smallest "
                          "aggregated layout whose weights leave KV for 64 clients")
    assert "tp1 ep1 pp1 (1 GPU) leaves no KV cache" in why and "\n" not in why
    assert _pick("serving.concurrency=128", "serving.kv_dtype=fp8")[2].describe() == "agg 1x(tp4 ep1 pp1, seqs 256)"
    assert _pick()[2].describe() == "agg 1x(tp4 ep1 pp1, seqs 256)"  # BF16 KV: 64 clients outgrow tp2


def test_deepseek_v3_needs_two_nodes_and_takes_expert_parallelism():
    """671B fp8 weights exceed one 8 x 80 GB node: tp8 ep2 (16 GPUs) before tp8 pp2."""
    _, _, plan, why = _pick(experiment="deepseek-8node")
    assert plan.describe() == "agg 1x(tp8 ep2 pp1, seqs 256)"
    assert "tp8 ep1 pp1 (8 GPUs) leaves no KV cache" in why


def test_a_rate_is_held_by_littles_law_and_a_load_no_layout_holds_takes_the_roomiest():
    _, _, plan, why = _pick("serving.rate=2")
    assert plan.describe() == "agg 1x(tp2 ep1 pp1, seqs 256)" and "KV for 2 req/s (~" in why
    _, _, plan, why = _pick("serving.concurrency=512", "serving.isl=32000")
    assert plan.describe() == "agg 1x(tp8 ep1 pp1, seqs 256)"
    assert "the most KV" in why and "none of up to 8 GPUs holds them all" in why


def test_no_layout_holding_one_request_is_bad_input():
    cfg = _cfg()
    ctx = replace(build_serving_context(cfg), cluster=Cluster.simple("h100-sxm", 1))  # 70B on one H100
    with pytest.raises(UserError, match=r"^serving.plan: no aggregated layout of up to 1 h100-sxm GPUs holds "
                                        r"llama-3.1-70b's weights and the KV of one 4608-token request$"):
        default_plan(ctx, build_serving_config(cfg.serving))


def test_run_serving_sim_without_a_plan_simulates_the_default_and_says_why(tmp_path, monkeypatch, capsys):
    from planner.apps.serve import run_serving_sim

    monkeypatch.setattr("planner.apps.serve.run_dir", lambda: tmp_path)
    payload = run_serving_sim(_cfg("serving.num_requests=32", "serving.concurrency=8", "serving.osl=64"))
    assert payload["result"]["feasible"] and payload["plan_source"].startswith("no plan given: simulating one "
                                                                               "worker of tp2 ep1 pp1")
    assert payload["plan_source"] in capsys.readouterr().out
    assert json.loads((tmp_path / "result.json").read_text())["plan_source"] == payload["plan_source"]
    memory = json.loads((tmp_path / "result.json").read_text())["memory"]
    assert list(memory) == ["both"] and memory["both"]["headroom_bytes"] >= 0  # the aggregated pool, by part
    assert (tmp_path / "trace.json").is_file()


def test_a_given_plan_that_cannot_serve_is_refused_in_one_line(tmp_path, monkeypatch):
    from planner.apps.serve import run_serving_sim

    monkeypatch.setattr("planner.apps.serve.run_dir", lambda: tmp_path)
    with pytest.raises(UserError, match=r"^serving.plan: agg 2x\(tp1 ep1 pp1, seqs 256\) cannot serve this load: "
                                        r"hbm_capacity: the pool's weights leave no room for a KV cache"):
        run_serving_sim(_cfg("serving.plan.pool.workers=2"))
    assert not (tmp_path / "result.json").exists()
    payload = run_serving_sim(_cfg("serving.plan.pool.tp=4", "serving.num_requests=16", "serving.osl=32"))
    assert payload["plan_source"] == "serving.plan of the config"


def test_each_pools_memory_is_shown_by_part_and_sums_to_its_total():
    from simcore.serving.kvcache import kv_bytes_per_token, pool_memory

    ctx, scfg, plan, _ = _pick()
    runtime = scfg.runtime_profile()
    for _role, pool in plan.pools:
        m = pool_memory(ctx, pool.strategy, runtime)
        parts = ("weights", "kv_cache", "activations", "runtime_reserved", "workspace")
        assert m["total_bytes"] == pytest.approx(sum(m[f"{p}_bytes"] for p in parts))
        assert m["kv_cache_bytes"] == pytest.approx(kv_capacity_tokens(ctx, pool.strategy, runtime)
                                                    * kv_bytes_per_token(ctx, pool.strategy))
        assert 0 < m["total_bytes"] <= m["capacity_bytes"] and m["headroom_bytes"] >= 0
        # tp2 holds half of tp1's weights per GPU
        half = pool_memory(ctx, pool.strategy.replace(tp=pool.strategy.tp * 2), runtime)["weights_bytes"]
        assert half == pytest.approx(m["weights_bytes"] / 2, rel=0.05)
