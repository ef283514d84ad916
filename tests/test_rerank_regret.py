"""Re-ranking regret: the proxy's exact top-K, the simulator-in-the-loop re-ranker, its memo and fit."""

import functools
import json

import numpy as np
import pytest

from planner.exact import brute_force
from planner.megatron import canonical_key
from planner.simloop import FEATURES, ProxyCorrection, SimMemo, sim_in_the_loop
from planner.space import SearchSpace
from planner.topk import top_k
from tests.conftest import make_ctx
from validation.studies.fidelity.rerank_regret import regret

CASES = [
    ("llama-3.1-70b", 8, {}, SearchSpace(8, (1, 2, 4, 8), (1,), (1, 2, 4), (8, 64, 256, 1024), (1, 2))),
    ("llama-3.1-70b", 8, {"phase": "prefill", "ttft_slo_s": 2.0},
     SearchSpace(8, (1, 2, 4, 8), (1,), (1, 2), (1, 4, 16, 64), (1, 2))),
    ("mixtral-8x7b", 8, {"tpot_slo_s": 0.02}, SearchSpace(8, (2, 4, 8), (1, 2), (1, 2), (32, 256, 1024), (1,))),
]


@functools.cache
def _brute_ranked(case: int) -> list[float]:
    """Every distinct valid plan's proxy value of ``CASES[case]``, best first (brute force, once)."""
    model, gpus, kw, space = CASES[case]
    ctx = make_ctx(model, gpus, **kw)
    ref = brute_force(ctx, space, limit=10**7)
    best: dict[tuple, float] = {}
    for key, v, r in zip(map(tuple, ref.keys.tolist()), ref.values, ref.reasons, strict=True):
        c = canonical_key(key, ctx.model)
        if r == 0 and v > best.get(c, -np.inf):
            best[c] = float(v)
    return sorted(best.values(), reverse=True)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] + f"-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("k", [1, 7, 60])
def test_top_k_equals_brute_force(case, k):
    model, gpus, kw, space = CASES[case]
    ctx = make_ctx(model, gpus, **kw)
    got = top_k(ctx, space, k)
    want = _brute_ranked(case)[:k]
    np.testing.assert_allclose(got.values, want, rtol=1e-12)
    assert len({canonical_key(key, ctx.model) for key in got.keys}) == len(got.keys)  # distinct plans
    assert np.all(np.diff(got.values) <= 0)  # best first


def test_top_k_rejects_k_below_one():
    with pytest.raises(ValueError, match="k must be >= 1"):
        top_k(make_ctx(), CASES[0][3], 0)


def test_regret_formula():
    assert regret(90.0, 100.0) == pytest.approx(0.1)
    assert regret(100.0, 100.0) == 0.0
    assert regret(0.0, 100.0) == 1.0
    assert np.isnan(regret(1.0, 0.0))


def test_memo_simulates_each_plan_once_and_persists(tmp_path):
    calls = []

    def sim(key):
        calls.append(key)
        return float(sum(key)), True

    path = tmp_path / "sims.jsonl"
    memo = SimMemo(sim, path, "fp-a")
    assert memo((1, 2)) == (3.0, True) and memo((1, 2)) == (3.0, True)
    assert calls == [(1, 2)] and (memo.hits, memo.misses) == (1, 1)
    again = SimMemo(sim, path, "fp-a")  # a second run reads the file: no simulation
    assert again((1, 2)) == (3.0, True) and calls == [(1, 2)]
    other = SimMemo(sim, path, "fp-b")  # another scenario's fingerprint: simulated anew
    other((1, 2))
    assert calls == [(1, 2), (1, 2)]
    assert [json.loads(line)["fingerprint"] for line in path.read_text().splitlines()] == ["fp-a", "fp-b"]


def test_correction_recovers_a_linear_law_and_reports_loo_error():
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(60), rng.random((60, len(FEATURES) - 1))])
    w = rng.normal(size=len(FEATURES))
    fit = ProxyCorrection(ridge=0.0).fit(x, x @ w)
    np.testing.assert_allclose(fit.coef, w, atol=1e-8)
    assert fit.rmse < 1e-8
    noisy = ProxyCorrection(ridge=1e-3).fit(x, x @ w + rng.normal(scale=0.1, size=60))
    assert 0.05 < noisy.rmse < 0.2  # leave-one-out error is about the noise
    with pytest.raises(ValueError, match="ridge must be >= 0"):
        ProxyCorrection(ridge=-1.0).fit(x, x @ w)


def _pool(n=200, seed=0):
    """A proxy-ranked pool whose simulator penalizes communication: the simulator's best sits deep."""
    rng = np.random.default_rng(seed)
    keys = np.zeros((n, 18), dtype=np.int64)
    keys[:, 0] = rng.choice([1, 2, 4, 8], n)
    keys[:, 1], keys[:, 2], keys[:, 3], keys[:, 5] = 1, rng.choice([1, 2, 4], n), 1, 1
    keys[:, 4] = np.arange(n)  # every plan distinct
    proxy = np.sort(rng.uniform(800, 1000, n))[::-1]
    comm = np.clip(0.6 * (1 - np.arange(n) / n) + rng.normal(scale=0.05, size=n), 0, 1)  # fast plans talk most
    features = np.column_stack([np.ones(n), 1 - comm, comm, np.zeros(n), np.log2(keys[:, 0]), np.zeros(n),
                                np.log2(keys[:, 2]), np.zeros(n), np.zeros(n)])
    sim = proxy * np.exp(-0.8 * comm)
    return keys, proxy, features, sim


def test_loop_finds_the_simulators_best_deep_in_the_pool():
    keys, proxy, features, sim = _pool()
    truth = {tuple(k): (float(v), True) for k, v in zip(keys.tolist(), sim, strict=True)}
    asked = []

    def simulate(key):
        asked.append(key)
        return truth[key]

    top16 = int(np.argmax(sim[:16]))
    best = int(np.argmax(sim))
    assert regret(sim[top16], sim[best]) > 0.02  # the case the loop exists for
    out = sim_in_the_loop(keys, proxy, features, simulate, budget=48)
    assert len(asked) == len(set(asked)) <= 48  # never simulates a plan twice, stays in budget
    assert out.best in out.simulated and out.sim_values[out.best] == max(out.sim_values.values())
    assert regret(sim[out.best], sim[best]) <= 0.02
    assert set(range(16)) <= set(out.simulated)  # never worse than re-ranking the top 16


def test_loop_stops_after_the_seed_when_the_proxy_is_right():
    keys, proxy, features, _ = _pool()
    out = sim_in_the_loop(keys, proxy, features, lambda key: (float(proxy[int(key[4])]), True), budget=100,
                          diverse=0)
    assert out.best == 0 and len(out.simulated) < 100


def test_loop_rejects_bad_budget_and_skips_invalid_plans():
    keys, proxy, features, _ = _pool(40)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        sim_in_the_loop(keys, proxy, features, lambda key: (1.0, True), budget=0)
    out = sim_in_the_loop(keys, proxy, features, lambda key: (5.0, key[4] != 0), budget=8, diverse=0)
    assert out.best != 0
    none = sim_in_the_loop(keys, proxy, features, lambda key: (5.0, False), budget=4)
    assert none.best is None


def test_shard_search_with_the_simulator_in_the_loop_memoizes_in_the_run_dir(tmp_path):
    from tests.test_apps import app

    args = ["experiment=dense-70b-1node", "planner=megatron", "planner.rerank_k=3", "planner.rerank_pool=40",
            "planner.rerank_budget=6", "planner.reference_lines=false", f"hydra.run.dir={tmp_path}"]
    proc = app("search", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    lines = (tmp_path / "sims.jsonl").read_text().splitlines()
    assert 3 <= len(results["top"]) == len(lines) <= 6  # the top 3 and acquisitions, within budget
    assert {r["proxy_rank"] for r in results["top"]} >= {1, 2, 3}
    best = max(r["tokens_per_s_per_gpu"] for r in results["top"] if r["valid"])
    assert results["reranked_tokens_per_s_per_gpu"] == pytest.approx(best)
    again = app("search", *args, cwd=tmp_path)  # same run dir: every plan comes from the memo
    assert again.returncode == 0 and len((tmp_path / "sims.jsonl").read_text().splitlines()) == len(lines)
    bad = app("search", "experiment=dense-70b-1node", "planner.rerank_pool=-1", f"hydra.run.dir={tmp_path / 'b'}",
              cwd=tmp_path)
    assert bad.returncode == 2 and "planner.rerank_pool" in bad.stderr


def test_rerank_regret_cli_prints_tables_and_one_json_line(tmp_path, capsys):
    from validation.studies.fidelity.rerank_regret import main

    args = ["--scenarios", "dense-70b-prefill", "--pool", "20", "--k", "4", "--budget", "6", "--out", str(tmp_path)]
    headline = main(args)
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == json.loads(json.dumps(headline))
    assert any("before: re-rank top 4" in line for line in out)
    before, after = headline["regret_before"]["dense-70b-prefill"], headline["regret_after"]["dense-70b-prefill"]
    assert 0.0 <= after <= before <= 1.0  # the loop simulates the top k too: never worse
    assert 4 <= headline["sims_after"]["dense-70b-prefill"] <= 6
    lines = (tmp_path / "dense-70b-prefill" / "sims.jsonl").read_text().splitlines()
    assert len(lines) == 20  # the whole pool simulated once, memoized
    main(args)
    assert len((tmp_path / "dense-70b-prefill" / "sims.jsonl").read_text().splitlines()) == 20


def test_fingerprint_follows_the_scenario_and_the_simulators_code():
    from planner.simloop import code_fingerprint, scenario_fingerprint

    a = {"model": {"name": "llama-3.1-70b"}, "topology": {"num_nodes": 1}, "sim": {"contention": True}}
    assert scenario_fingerprint(a) == scenario_fingerprint(dict(a))  # stable across calls and processes
    assert scenario_fingerprint(a) != scenario_fingerprint(a | {"topology": {"num_nodes": 2}})
    assert scenario_fingerprint(a).endswith(code_fingerprint())
    assert scenario_fingerprint(a, "proxy") != scenario_fingerprint(a)
