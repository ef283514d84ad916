"""Serving planner: masks, exact optimum against brute force, PPO against random, Pareto front,
launch configs, the SLO miss report, and the apps' bad input (one line, exit 2)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from planner.serving import (
    METHODS,
    ServingEvaluator,
    ServingSpace,
    closest_misses,
    method_config,
    pareto_mask,
    run_method,
)
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
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload

ENTRY = {"search": "from planner.apps.search import main; main()", "sim": "from planner.apps.sim import main; main()"}


def _case(gpus=4, ttft=0.5, tpot=0.02, seqs=(8, 32), tp=(1, 2, 4)):
    ctx = CostContext(get_model("llama-3.1-8b"), Workload(precision="fp8", input_len=1024, output_len=64),
                      Cluster.simple("h100-sxm", gpus))
    cfg = ServingConfig(concurrency=24, num_requests=48, input_len=LengthDist(mean=1024), output_len=LengthDist(mean=64),
                        runtime="vllm", ttft_slo_s=ttft, tpot_slo_s=tpot)
    space = ServingSpace(ctx, get_runtime("vllm"), max_len=1088, tp=tp, pp=(1,), max_num_seqs=seqs)
    return ctx, cfg, space


@pytest.fixture(scope="module")
def small():
    ctx, cfg, space = _case()
    ev = ServingEvaluator(ctx, space, cfg, budget=1)
    run_method("exact", ev, method_config(), 0)
    return ctx, cfg, space, ev


def test_masks_hold_every_plan_in_the_cluster(small):
    ctx, _, space, _ = small
    actions = space.enumerate()
    assert len(actions) == space.size > 20
    assert space.inside(actions).all()
    for a in actions:
        plan = space.plan(a)
        assert plan.gpus <= ctx.cluster.num_gpus
        assert (space.action_of(plan) == a).all()  # one action per plan
        if plan.mode == "agg":
            assert (a[5:9] == 0).all()
    rng = np.random.default_rng(0)
    assert space.inside(space.sample(None, rng, 200)).all()
    assert space.inside(space.project(rng.integers(0, 9, space.num_heads) % space.sizes)[None]).all()


def test_exact_equals_brute_force(small):
    """Every plan simulated on its own: the best meeting the SLOs is what planner=exact reports."""
    ctx, cfg, space, ev = small
    best, best_plan = -1.0, None
    for a in space.enumerate():
        r = simulate_serving(ctx, space.plan(a), cfg)
        m = r.metrics
        if r.feasible and m.ttft_s["mean"] <= cfg.ttft_slo_s and m.tpot_s["mean"] <= cfg.tpot_slo_s \
                and m.output_tokens_per_s_per_gpu > best:
            best, best_plan = m.output_tokens_per_s_per_gpu, space.plan(a)
    assert ev.sims == space.size
    assert ev.best_value == pytest.approx(best, rel=1e-12)
    assert simulate_serving(ctx, space.plan(ev.best_key), cfg).metrics.output_tokens_per_s_per_gpu == best
    assert best_plan is not None


def test_searches_find_the_exact_optimum_and_ppo_beats_random(small):
    """At a budget of a fifth of the space, PPO (the shipped ppo.yaml knobs) reaches the exact optimum
    on both seeds; uniform random proposals and annealing at the same budget do no better."""
    ctx, cfg, space, exact = small
    budget = space.size // 5
    found = {}
    for name in ("ppo", "annealing", "random"):
        values = []
        for seed in (0, 1):
            ev = ServingEvaluator(ctx, space, cfg, budget=budget)
            run_method(name, ev, method_config(T=5, elite_prior=4.0, d_model=64, hidden=64), seed)
            assert ev.sims <= budget
            values.append(ev.best_value)
        found[name] = values
    assert found["ppo"] == pytest.approx([exact.best_value] * 2)
    assert min(found["ppo"]) >= max(found["random"] + found["annealing"])


@pytest.mark.parametrize("name", ["tpe", "cmaes"])
def test_optuna_samplers_respect_the_budget(small, name):
    pytest.importorskip("optuna")
    if name == "cmaes":
        pytest.importorskip("cmaes")
    ctx, cfg, space, exact = small
    ev = ServingEvaluator(ctx, space, cfg, budget=12)
    run_method(name, ev, method_config(), 0)
    assert ev.sims == 12 and len(ev.records) == 12
    assert 0 < ev.best_value <= exact.best_value


def test_memo_and_budget():
    ctx, cfg, space = _case(seqs=(32,), tp=(1, 2))
    ev = ServingEvaluator(ctx, space, cfg, budget=3)
    a = space.megatron()[0]
    ev.evaluate_actions(np.array([a, a, a]))
    assert ev.sims == 1 and ev.proposals == 3  # repeats are free
    out = ev.evaluate_actions(space.enumerate())
    assert ev.sims == 3 and ev.done and len(out) < space.size
    assert set(METHODS) >= {"ppo", "random", "annealing", "genetic", "megatron", "exact", "tpe", "cmaes"}


def test_unmeetable_slos_report_the_closest_misses():
    ctx, cfg, space = _case(ttft=1e-4, tpot=1e-4, seqs=(32,), tp=(1, 2))
    ev = ServingEvaluator(ctx, space, cfg, budget=6)
    run_method("random", ev, method_config(), 0)
    assert ev.best_value < 0  # nothing meets: the objective is the graded miss
    misses = closest_misses(ev.records.values(), k=3)
    assert len(misses) == 3
    for m in misses:
        assert m["ttft_over_pct"] == pytest.approx(100 * (m["ttft_ms"] / 0.1 - 1))
        assert m["tpot_over_pct"] > 0
    assert [max(m["ttft_over_pct"], m["tpot_over_pct"]) for m in misses] == \
        sorted(max(m["ttft_over_pct"], m["tpot_over_pct"]) for m in misses)


def test_closest_misses_list_a_plan_once_whatever_its_unreached_max_num_seqs():
    """24 clients never reach 64 or 128 running sequences on one worker: the three plans simulate alike and
    are listed once; a plan of another layout is listed after it."""
    ctx, cfg, space = _case(ttft=1e-4, tpot=1e-4, seqs=(32, 64, 128), tp=(1, 2))
    ev = ServingEvaluator(ctx, space, cfg, budget=8)
    for tp in (1, 2):
        for seqs in (32, 64, 128):
            ev.evaluate_actions(space.action_of(ServingPlan("agg", pool=Pool(runtime_strategy(tp=tp), 1, seqs)))[None])
    assert len(ev.records) == 6
    misses = closest_misses(ev.records.values(), k=3)
    assert len(misses) == 2  # one per layout
    assert {m["plan"].split(", seqs")[0] for m in misses} == {"agg 1x(tp1 ep1 pp1", "agg 1x(tp2 ep1 pp1"}


def test_pareto_front_is_non_dominated():
    rng = np.random.default_rng(5)
    x, y = rng.random(300), rng.random(300)
    x[:3] = np.nan
    front = pareto_mask(x, y)
    assert front.any() and not front[:3].any()
    for i in np.flatnonzero(front):
        assert not ((x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))).any()
    for j in np.flatnonzero(~front)[3:]:
        assert ((x[front] >= x[j]) & (y[front] >= y[j])).any()
    assert pareto_mask([1, 2, 3], [3, 2, 1]).all() and pareto_mask([1, 2], [1, 2]).tolist() == [False, True]


def test_launch_configs_carry_the_degrees():
    from simcore.export.serving import serving_launch

    m = get_model("deepseek-v3")
    plan = ServingPlan.disaggregated(Pool(megatron_strategy(tp=8, ep=2), 2, 256),
                                     Pool(megatron_strategy(tp=1, ep=32), 1, 1024))
    vllm = serving_launch(plan, m, "vllm", gpus_per_node=8, precision="fp8").to_text()
    assert vllm.count("--is-prefill-worker") == 2 and "dynamo.frontend" in vllm
    assert "--tensor-parallel-size 8" in vllm and "--data-parallel-size 32" in vllm
    sgl = serving_launch(plan, m, "sglang", gpus_per_node=8, precision="fp8").to_text()
    assert sgl.count("--disaggregation-mode prefill") == 2 and sgl.count("--disaggregation-mode decode") == 1
    assert "--tp-size 16 --dp-size 2 --enable-dp-attention" in sgl and "--ep-size 32" in sgl
    assert "--pd-disaggregation" in sgl
    trt = serving_launch(plan, m, "trtllm", gpus_per_node=8, precision="fp8")
    decode = yaml.safe_load(trt.files["trtllm_decode.yaml"])
    assert decode["moe_expert_parallel_size"] == 32 and decode["enable_attention_dp"] is True
    router = yaml.safe_load(trt.files["trtllm_disagg.yaml"])
    assert router["context_servers"]["num_instances"] == 2 and router["generation_servers"]["num_instances"] == 1
    agg = serving_launch(ServingPlan.aggregated(megatron_strategy(tp=4), 2, 64), get_model("llama-3.1-70b"), "vllm",
                         gpus_per_node=8).to_text()
    assert agg.count("vllm serve") == 2 and "--tensor-parallel-size 4" in agg and "--max-num-seqs 64" in agg


def _app(name, *args, cwd):
    return subprocess.run([sys.executable, "-c", ENTRY[name], *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize(("app", "args", "field"), [
    ("sim", ["serving.concurrency=0"], "serving.concurrency"),
    ("sim", ["serving.runtime=tgi"], "serving.runtime"),
    ("sim", ["serving.mem_fraction=1.5"], "serving.mem_fraction"),
    ("sim", ["serving.frontend_token_us=-3"], "serving.frontend_token_us"),
    ("sim", ["serving.trace=TRACE_MISSING"], "output_len"),
    ("search", ["serving.trace=TRACE_NEGATIVE"], "input_len"),
    ("search", ["serving.search.pool_seeds=-1"], "serving.search.pool_seeds"),
    # the methods' settings by the static search's rules (a population of 0 had hung the search)
    ("search", ["planner=genetic", "planner.population=0", "serving.search.budget=40"], "planner.population"),
    ("search", ["planner.learning_rate=-1"], "planner.learning_rate"),
    ("search", ["planner=annealing", "planner.t0=0"], "planner.t0"),
    ("search", ["planner.budget=50"], "serving.search.budget"),  # not the serving search's budget: refused
    # search fields that had been accepted and silently dropped or replaced by a default
    ("search", ["serving.search.tp=[]"], "serving.search.tp"),
    ("search", ["serving.search.loads=[0.5,0]"], "serving.search.loads"),
    ("search", ["serving.search.tpot_grid_ms=[-5]"], "serving.search.tpot_grid_ms"),
    ("search", ["serving.search.max_proposals=0"], "serving.search.max_proposals"),
    ("search", ["serving.search.pareto_plans=-1"], "serving.search.pareto_plans"),
    ("sim", ["serving.num_requests=0"], "serving.num_requests"),
    ("sim", ["serving.seed=-1"], "serving.seed"),
    # named as set: had been "serving.isl.std" and "serving.ttft_slo_s ... got -0.005" (converted to seconds)
    ("sim", ["serving.isl_std=-1"], "serving.isl_std"),
    ("sim", ["serving.ttft_slo_ms=0"], "serving.ttft_slo_ms"),
    ("search", ["serving.tpot_slo_ms=-5"], "serving.tpot_slo_ms must be a positive number of milliseconds, got -5.0"),
    # seesaw-only: had been accepted and ignored on an aggregated plan
    ("sim", ["serving.plan.host_kv_bytes_per_gpu=1e11"], "serving.plan.host_kv_bytes_per_gpu"),
    # expert parallelism inside the TP group: a degree not dividing tp, and one on a dense model
    ("sim", ["serving.plan.pool.tp=8", "serving.plan.pool.moe_ep=3"], "serving.plan.pool"),
    ("sim", ["serving.plan.pool.tp=8", "serving.plan.pool.moe_ep=8"], "serving.plan.pool.moe_ep"),
    ("search", ["serving.search.moe_ep=[1,8]"], "serving.search.moe_ep"),
    # a typed plan that cannot serve (tp1: 70B fp8 weights fill an H100), even one equal to the defaults;
    # without serving.plan.* shard-sim picks a plan that fits (test_serving_default)
    ("sim", ["serving.plan.pool.tp=1"], "serving.plan: agg 1x(tp1 ep1 pp1, seqs 256) cannot serve this load"),
    ("sim", ["serving.trace_requests=-2"], "serving.trace_requests"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, app, args, field):
    (tmp_path / "missing.csv").write_text("arrival_s,input_len\n0,10\n")
    (tmp_path / "negative.csv").write_text("arrival_s,input_len,output_len\n0,-5,10\n")
    args = [a.replace("TRACE_MISSING", str(tmp_path / "missing.csv")).replace("TRACE_NEGATIVE",
                                                                            str(tmp_path / "negative.csv")) for a in args]
    proc = _app(app, "workload=serving", "experiment=dense-70b-1node", f"hydra.run.dir={tmp_path}", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr


@pytest.mark.parametrize(("setting", "value"), [("population", 0), ("elitism", 99), ("tournament", 0),
                                                 ("learning_rate", 0.0), ("tau", 1.5), ("mutation", 2.0)])
def test_method_config_refuses_bad_settings_naming_the_field(setting, value):
    with pytest.raises(ValueError, match=f"planner.{setting}"):
        method_config(None, **{setting: value})
    assert method_config(None).population >= 1  # the defaults pass


def test_search_writes_outputs_and_sim_replays_the_plan(tmp_path):
    common = ["workload=serving", "experiment=dense-70b-1node", "serving.concurrency=16", "serving.isl=512",
              "serving.osl=32", "serving.ttft_slo_ms=1000", "serving.tpot_slo_ms=40", "serving.search.tp=[2,4,8]",
              "serving.search.max_num_seqs=[32]"]
    out = tmp_path / "search"
    proc = _app("search", *common, "planner=random", "serving.search.budget=6", "serving.search.loads=[0.5,1]",
                f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # it talks: a progress bar over the 6 simulations and one over the front's; SLOs as met or over
    assert "random on dense-70b-1node" in proc.stdout and "6/6" in proc.stdout
    assert "the front at the other loads" in proc.stdout and "TTFT SLO" in proc.stdout
    for name in ("summary.json", "best_plan.yaml", "candidates.csv", "pareto.csv", "pareto.png", "best_per_slo.csv",
                 "launch_vllm.sh", "launch_sglang.sh", "launch_trtllm.sh"):
        assert (out / name).is_file(), name
    rows = list(csv.DictReader((out / "pareto.csv").open()))
    pts = [(float(r["tokens_per_s_per_gpu"]), float(r["tokens_per_s_per_user"])) for r in rows]
    front = [p for p, r in zip(pts, rows, strict=True) if r["on_front"] == "True"]
    assert front and all(not (a[0] >= f[0] and a[1] >= f[1] and a != f) for f in front for a in pts)
    plan = yaml.safe_load((out / "best_plan.yaml").read_text())["serving_plan"]
    tp = (plan.get("both") or plan["decode"])["tp"]
    assert f"--tensor-parallel-size {tp}" in (out / "launch_vllm.sh").read_text()
    sim = _app("sim", *common, f"plan={out / 'best_plan.yaml'}", f"hydra.run.dir={tmp_path / 'sim'}", cwd=tmp_path)
    assert sim.returncode == 0, sim.stderr
    import json

    summary = json.loads((out / "summary.json").read_text())
    result = json.loads((tmp_path / "sim" / "result.json").read_text())
    replay = result["result"]["metrics"]
    # the replay prints and writes its mean decode step, parts adding up to the GPU time (test_serving_breakdown)
    assert "the run's mean decode step" in sim.stdout
    for role, step in result["mean_decode_step"].items():
        assert role in ("both", "decode") and step["gpu_ms"] > 0 and step["bound"] in ("gpu", "host")
        assert sum(step["parts_ms"].values()) == pytest.approx(step["gpu_ms"], rel=1e-9)
        assert step["sequences"] == max(round(result["result"]["pools"][role]["mean_decode_seqs"]), 1)
    assert replay["output_tokens_per_s_per_gpu"] == pytest.approx(summary["best"]["tokens_per_s_per_gpu"], rel=1e-9)
    assert Path(out / "pareto.png").stat().st_size > 1000
    # the journal of that run replays it: +resume answers every plan from it and gives the same answer
    assert (out / "serving_sims.pkl").is_file()
    again = _app("search", *common, "planner=random", "serving.search.budget=6", "serving.search.loads=[0.5,1]",
                 f"hydra.run.dir={tmp_path / 'other'}", f"+resume={out}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["best"] == summary["best"] and resumed["sim_wall_s"] == 0.0  # nothing simulated again
    changed = _app("search", *common, "planner=random", "serving.search.budget=7", f"+resume={out}", cwd=tmp_path)
    assert changed.returncode == 2 and "serving.search.budget" in changed.stderr


def test_the_search_table_shows_each_layout_once_and_its_slos_as_met_or_over():
    """A plan simulated at several max_num_seqs is one row (its best, and how many were tried); an SLO
    reads ``met`` or how far over, never "+0%"."""
    from types import SimpleNamespace

    from planner.apps.serving_search import distinct_layouts, slo_cell

    def rec(tp, seqs):
        return SimpleNamespace(plan=ServingPlan.aggregated(runtime_strategy(tp=tp), 1, seqs))

    ranked = [rec(2, 64), rec(4, 32), rec(2, 32), rec(2, 128)]
    rows = distinct_layouts(ranked)
    assert [(r.plan.describe(), n) for r, n in rows] == [("agg 1x(tp2 ep1 pp1, seqs 64)", 3),
                                                        ("agg 1x(tp4 ep1 pp1, seqs 32)", 1)]
    assert [slo_cell(x, 50.0) for x in (0.0, 0.123, 0.004)] == ["met", "+12% over", "+0.4% over"]
    assert slo_cell(0.0, None) == "-"
