"""The serving search's journal: an interrupted search resumed from it ends exactly where an
uninterrupted one does, simulating only what the journal lacks; torn records and other configs."""

from __future__ import annotations

import pickle

import pytest

import planner.serving.evaluator as evaluator_module
from planner.apps.common import UserError
from planner.serving import ServingEvaluator, ServingSpace, method_config, run_method
from planner.serving.journal import JOURNAL_NAME, SimJournal
from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import LengthDist, ServingConfig, get_runtime
from simcore.workload import Workload

CONFIG = {"serving": {"concurrency": 16, "isl": 512}, "seed": 0}
BUDGET = 8
KNOBS = {"T": 4, "elite_prior": 4.0, "d_model": 32, "hidden": 32}


@pytest.fixture(scope="module")
def case():
    ctx = CostContext(get_model("llama-3.1-8b"), Workload(precision="fp8", input_len=512, output_len=32),
                      Cluster.simple("h100-sxm", 4))
    cfg = ServingConfig(concurrency=16, num_requests=32, input_len=LengthDist(mean=512), output_len=LengthDist(mean=32),
                        runtime="vllm", ttft_slo_s=0.5, tpot_slo_s=0.03)
    space = ServingSpace(ctx, get_runtime("vllm"), max_len=544, tp=(1, 2, 4), pp=(1,), max_num_seqs=(8, 16, 32))
    return ctx, cfg, space


@pytest.fixture
def counted(monkeypatch):
    """Counts the simulations actually run (not replayed)."""
    calls = []
    real = evaluator_module.simulate_serving

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator_module, "simulate_serving", counting)
    return calls


def _search(case, journal=None, stop=None) -> ServingEvaluator:
    ctx, cfg, space = case
    ev = ServingEvaluator(ctx, space, cfg, budget=BUDGET, journal=journal)
    run_method("ppo", ev, method_config(**KNOBS), 0, stop=stop)
    return ev


def _trace(ev: ServingEvaluator):
    recs = sorted(ev.records.values(), key=lambda r: r.index)
    return ev.order, [(r.key, r.result.metrics.to_ms_dict() if r.feasible else r.result.reason) for r in recs]


def test_a_resumed_search_equals_an_uninterrupted_one(case, counted, tmp_path):
    full = _search(case)
    assert full.sims == BUDGET and len(counted) == BUDGET
    cut = 3  # interrupt after three simulations
    first = SimJournal(tmp_path, CONFIG)
    part = _search(case, first, stop=lambda: len(counted) >= BUDGET + cut)
    first.close()
    assert cut <= part.sims < BUDGET
    done = part.sims
    counted.clear()
    resumed_journal = SimJournal(tmp_path, CONFIG, resume=True)
    assert len(resumed_journal.stored) == done
    resumed = _search(case, resumed_journal)
    resumed_journal.close()
    assert _trace(resumed) == _trace(full)  # same proposals, same plans, same metrics
    assert len(counted) == BUDGET - done  # only what the journal lacked was simulated
    again = SimJournal(tmp_path, CONFIG, resume=True)  # the journal now holds the whole run
    assert len(again.stored) == BUDGET
    again.close()


def test_a_torn_last_record_is_dropped_and_the_rest_replayed(case, tmp_path):
    journal = SimJournal(tmp_path, CONFIG)
    ev = _search(case, journal)
    journal.close()
    path = tmp_path / JOURNAL_NAME
    whole = path.read_bytes()
    record = pickle.dumps(((9, 9, 9), "a record cut short"), protocol=pickle.HIGHEST_PROTOCOL)
    path.write_bytes(whole + record[: len(record) // 2])
    loaded = SimJournal(tmp_path, CONFIG, resume=True)
    loaded.close()
    assert len(loaded.stored) == ev.sims and path.read_bytes() == whole  # the torn tail is cut off


def test_a_journal_of_another_config_or_a_fresh_run_over_one_is_refused(case, tmp_path):
    SimJournal(tmp_path, CONFIG).close()
    with pytest.raises(UserError, match=r"serving\.concurrency: checkpoint has 16, this run has 32"):
        SimJournal(tmp_path, {"serving": {"concurrency": 32, "isl": 512}, "seed": 0}, resume=True)
    with pytest.raises(UserError, match="continue it with"):
        SimJournal(tmp_path, CONFIG)
    with pytest.raises(UserError, match="no serving_sims.pkl"):
        SimJournal(tmp_path / "empty", CONFIG, resume=True)
