"""The serving runtimes' request path (``RuntimeProfile.request_s`` + ``tokenize_s_per_token`` per prompt token):
simulated as a delay before the scheduler, read by the fit additively (``validation/studies/serving/fit.py``), and
shipped at what ``python -m validation.studies.serving.fit --only-request`` writes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from simcore.serving import (
    LengthDist,
    ServingConfig,
    ServingInputError,
    ServingPlan,
    get_runtime,
    simulate_serving,
)
from simcore.strategy.sharding import megatron_strategy
from validation.studies.serving.fit import GRID_REQUEST_S, GRID_TOKENIZE_S_PER_TOKEN, fit_request
from validation.studies.serving.host_replay import Recording, request_path_s, retime

_SHIPPED = Path(__file__).resolve().parents[1] / "validation" / "data" / "serving_request_path_fit.json"


def _ctx():
    from tests.test_serving import _ctx as ctx

    return ctx()


def test_the_request_path_grows_with_the_prompt_by_the_tokenizer_rate():
    """One client, fixed lengths, the server idle while a request is on its way: TTFT grows by exactly
    ``request_s + tokenize_s_per_token x prompt``, TPOT not at all."""
    ctx = _ctx()
    plan = ServingPlan.aggregated(megatron_strategy(tp=1), 1, 8)
    rt = get_runtime("sglang").with_overrides(request_s=0.0, tokenize_s_per_token=0.0)
    for prompt in (400, 1600):
        cfg = ServingConfig(concurrency=1, num_requests=3, runtime="sglang", input_len=LengthDist(mean=prompt),
                            output_len=LengthDist(mean=5))
        base, slow = (simulate_serving(ctx, plan, cfg, runtime=rt.with_overrides(**kw)).metrics
                      for kw in ({}, {"request_s": 0.02, "tokenize_s_per_token": 2e-6}))
        assert slow.ttft_s["mean"] == pytest.approx(base.ttft_s["mean"] + 0.02 + 2e-6 * prompt, rel=1e-9)
        assert slow.tpot_s["mean"] == pytest.approx(base.tpot_s["mean"], rel=1e-9)
    assert rt.with_overrides(request_s=0.01, tokenize_s_per_token=1e-6).request_path_s(3000) == pytest.approx(0.013)
    with pytest.raises(ServingInputError, match="tokenize_s_per_token"):
        rt.with_overrides(tokenize_s_per_token=-1e-6)


def _rows(made: tuple[float, float]) -> list:
    """Four one-request recordings (1 s to the first token, prompts of 1k and 8k tokens) whose measured TTFT
    is that plus the request path ``made`` (fixed, per token), at InferenceX's lengths."""
    rows = []
    for isl in (1024, 8192, 1024, 8192):
        rec = Recording(gpu_s=np.ones(2), seqs=np.ones(2), sent=np.array([-1]), first=np.array([0]),
                        finish=np.array([1]), tokens=np.array([2.0]), prompt=np.array([float(isl)]), overlap=False)
        ttft = retime(rec, 0.0, 0.0)[0] + made[0] + made[1] * isl
        rows.append((SimpleNamespace(isl=isl, osl=1024, row={"silicon_ttft_ms": str(ttft * 1e3)}), rec))
    return rows


def test_the_fit_finds_the_fixed_latency_and_the_tokenizer_rate_the_rows_were_made_with():
    rows = _rows((20e-3, 2e-6))
    assert request_path_s(rows[1][1], 20e-3, 2e-6) == pytest.approx(20e-3 + 2e-6 * 8192)
    found = fit_request(rows, 0.0, 0.0)
    assert (found["request_s"], found["tokenize_s_per_token"]) == (20e-3, 2e-6)
    assert found["ttft_median_abs_log_error"] < 1e-9 and found["ttft_client"] == "harness"


def test_the_request_path_is_bounded_by_what_its_mechanisms_take():
    """Rows that want a 300 ms path get the grids' largest values: the rest stays the simulation's error
    (runtime.py, ``request_s``), not a longer path."""
    found = fit_request(_rows((300e-3, 0.0)), 0.0, 0.0)
    assert found["request_s"] == max(GRID_REQUEST_S) == 50e-3
    assert found["tokenize_s_per_token"] == max(GRID_TOKENIZE_S_PER_TOKEN) == 4e-6
    assert found["ttft_median_abs_log_error"] > 0.05


def test_the_shipped_request_path_is_what_the_fit_command_wrote():
    """``python -m validation.studies.serving.fit --only-request --write validation/data/serving_request_path_fit.json``
    (validation/reports/serving/history.md): each runtime's shipped values are that output's."""
    fitted = json.loads(_SHIPPED.read_text())
    assert set(fitted) == {"vllm-sync", "sglang", "trtllm"}
    for name, values in fitted.items():
        names = [name] + (["vllm"] if name == "vllm-sync" else []) + (["sglang-deepep"] if name == "sglang" else [])
        for runtime in map(get_runtime, names):
            for field in ("step_host_s", "step_host_per_seq_s", "request_s", "tokenize_s_per_token"):
                assert getattr(runtime, field) == values[field], (runtime.name, field)
