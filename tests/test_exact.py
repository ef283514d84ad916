"""The exact optimum equals brute force over every degree row and every operator choice."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.exact import brute_force, exact_optimum
from planner.megatron import megatron_search
from planner.space import SearchSpace
from tests.conftest import make_ctx

CASES = [
    # (model, gpus, workload kwargs, space): memory binds in each, SLOs bind where given
    ("llama-3.1-70b", 8, {}, SearchSpace(8, (1, 2, 4, 8), (1,), (1, 2, 4), (8, 64, 256, 1024, 4096), (1, 2))),
    ("llama-3.1-70b", 8, {"tpot_slo_s": 0.03}, SearchSpace(8, (1, 2, 4, 8), (1,), (1, 2), (64, 256, 1024), (1, 2))),
    ("llama-3.1-70b", 8, {"phase": "prefill", "ttft_slo_s": 2.0},
     SearchSpace(8, (1, 2, 4, 8), (1,), (1, 2), (1, 4, 16, 64), (1, 2))),
    ("mixtral-8x7b", 8, {"tpot_slo_s": 0.02}, SearchSpace(8, (2, 4, 8), (1, 2), (1, 2), (32, 256, 1024), (1,))),
]


def _check(ctx, space):
    fast, ref = exact_optimum(ctx, space), brute_force(ctx, space, limit=10**7)
    assert fast.tokens_per_s_per_gpu == pytest.approx(ref.tokens_per_s_per_gpu, rel=1e-12, nan_ok=True)
    assert fast.calls <= ref.calls
    if fast.key is not None:  # the answer is a real strategy with that value
        i = np.flatnonzero((ref.keys == np.array(fast.key)).all(axis=1))[0]
        assert ref.reasons[i] == 0 and ref.values[i] == pytest.approx(fast.tokens_per_s_per_gpu, rel=1e-12)
    return fast


@pytest.mark.parametrize(("model", "gpus", "kw", "space"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_exact_equals_brute_force(model, gpus, kw, space):
    fast = _check(make_ctx(model, gpus, **kw), space)
    assert fast.key is not None


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sets(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3),
       pp=st.sets(st.sampled_from([1, 2, 4]), min_size=1, max_size=2),
       batch=st.sets(st.sampled_from([4, 32, 128, 512, 2048]), min_size=1, max_size=3),
       slo=st.sampled_from([None, 0.02, 0.05]), model=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b"]))
def test_exact_equals_brute_force_on_random_spaces(tp, pp, batch, slo, model):
    ctx = make_ctx(model, 8, tpot_slo_s=slo)
    ep = (1, 2, 8) if model.startswith("mixtral") else (1,)
    _check(ctx, SearchSpace(8, tuple(sorted(tp)), ep, tuple(sorted(pp)), tuple(sorted(batch)), (1, 2)))


def test_static_workload_falls_back_to_brute_force():
    ctx = make_ctx("llama-3.1-8b", 4, phase="static", input_len=512, output_len=64)
    space = SearchSpace(4, (1, 2, 4), (1,), (1,), (8, 64), (1,))
    assert exact_optimum(ctx, space).tokens_per_s_per_gpu == brute_force(ctx, space).tokens_per_s_per_gpu
    with pytest.raises(ValueError, match="exceeds the limit"):
        exact_optimum(ctx, space, brute_force_limit=10)


def test_exact_is_at_least_megatron_on_deepseek():
    ctx = make_ctx("deepseek-v3", 64, precision="fp8", input_len=4096, tpot_slo_s=0.1)
    space = SearchSpace(64, (1, 4, 8), (8, 16), (1, 2), (256, 2048), (1, 2))
    ranked = megatron_search(ctx, space)
    meg = ranked.result.tokens_per_s_per_gpu[ranked.order[0]]
    assert exact_optimum(ctx, space).tokens_per_s_per_gpu >= meg * (1 - 1e-12)


@pytest.mark.slow
def test_exact_equals_brute_force_on_deepseek_with_shared_experts_and_dense_layers():
    ctx = make_ctx("deepseek-v3", 64, precision="fp8", input_len=16384)
    _check(ctx, SearchSpace(64, (4, 8), (8,), (2,), (64, 1024), (1, 2)))
