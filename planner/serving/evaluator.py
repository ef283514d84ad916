"""Serving plans behind a budget of simulations: every method proposes through one :class:`ServingEvaluator`.

The budget counts :func:`simcore.serving.simulate_serving` calls. A plan proposed again is answered
from the memo (free); a proposal outside the space (a mask violated) is refused without a simulation.
So that a method that keeps proposing known plans still ends, a method may make at most
``max_proposals`` proposals in all (then :attr:`calls` reads as the budget, as it does once every plan
of the space has been simulated).

The objective, shared by every method (the metaheuristics and PPO read it as "throughput"):

- a plan meeting the SLOs (mean TTFT and mean TPOT at or under their targets; an absent SLO is met):
  its output tokens/s per GPU used;
- a plan that runs but misses: ``-reference * (0.1 + 0.4 * m / (1 + m))`` with
  ``m = ln(max(TTFT / SLO, 1)) + ln(max(TPOT / SLO, 1))``, in ``(-0.5, -0.1]`` of the reference: below
  every plan that meets them, above every plan that cannot run (the invalid reward, -1), and closer
  to 0 the less it misses, so searches are pulled toward feasibility;
- a plan that cannot run (its KV cache does not hold the load, a request stalls): invalid.

``reference`` is the best throughput of the Megatron-style plans of the warm start (of its pool-by-pool
disaggregated seeds, :mod:`planner.serving.poolwise`, where none of those runs), as in
:class:`planner.evaluator.Evaluator`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from planner.evaluator import Outcome
from planner.serving.agg_seeds import aggregated_seeds, screen_decodes, screened_decodes
from planner.serving.poolwise import screen_plans
from planner.serving.space import MODE_VALUES, ServingSpace
from simcore.serving import ServingConfig, ServingPlan, ServingResult, simulate_serving

__all__ = ["ServingEvaluator", "Record", "slo_miss"]


def slo_miss(ttft_s: float, tpot_s: float, ttft_slo_s: float | None, tpot_slo_s: float | None
             ) -> tuple[float, float, float]:
    """``(ttft_over, tpot_over, m)``: the fraction each mean is over its SLO (0 when met) and the
    log-miss ``m`` of the module docstring."""
    def over(v, slo):
        return 0.0 if slo is None or not v > slo else v / slo - 1.0

    t1, t2 = over(ttft_s, ttft_slo_s), over(tpot_s, tpot_slo_s)
    return t1, t2, math.log1p(t1) + math.log1p(t2)


@dataclass
class Record:
    """One simulated plan: its result, throughput (NaN when it cannot run) and SLO misses."""

    key: tuple[int, ...]
    plan: ServingPlan
    result: ServingResult
    index: int
    tokens_per_s_per_gpu: float
    ttft_over: float
    tpot_over: float
    miss: float

    @property
    def feasible(self) -> bool:
        return self.result.feasible

    @property
    def meets(self) -> bool:
        return self.feasible and self.miss == 0.0


class ServingEvaluator:
    """Memoized :func:`simulate_serving` behind ``budget`` simulations (see the module docstring)."""

    def __init__(self, ctx, space: ServingSpace, cfg: ServingConfig, budget: int, graph=None, runtime=None,
                 max_proposals: int | None = None, journal=None, pool_seeds: int = 4) -> None:
        if budget < 1:
            raise ValueError(f"serving.search.budget must be >= 1, got {budget}")
        self.ctx, self.actions, self.cfg, self.graph, self.runtime = ctx, space, cfg, graph, runtime
        self.budget = int(budget)
        self.max_proposals = int(max_proposals or 20 * budget)
        self.reference = 1.0
        self.sims = 0
        self.proposals = 0
        self.sim_wall_s = 0.0
        self.records: dict[tuple[int, ...], Record] = {}
        self.order: list[tuple[int, ...]] = []  # every proposal's key, in order
        self.listener = None
        self.journal = journal  # a planner.serving.journal.SimJournal: simulations kept and replayed
        if pool_seeds < 0:
            raise ValueError(f"serving.search.pool_seeds must be >= 0, got {pool_seeds}")
        self.pool_seeds = int(pool_seeds)  # disaggregated seeds of the warm start (planner.serving.poolwise)

    # ----- budget ----------------------------------------------------------------------------------
    @property
    def exhausted(self) -> bool:
        return self.proposals >= self.max_proposals or len(self.records) >= self.actions.size

    @property
    def calls(self) -> int:
        return self.budget if self.exhausted else self.sims

    @property
    def remaining(self) -> int:
        return max(self.budget - self.calls, 0)

    @property
    def done(self) -> bool:
        return self.calls >= self.budget

    # ----- the objective ------------------------------------------------------------------------------
    def value(self, rec: Record) -> float:
        if not rec.feasible:
            return float("nan")
        if rec.miss == 0.0:
            return rec.tokens_per_s_per_gpu
        return -self.reference * (0.1 + 0.4 * rec.miss / (1.0 + rec.miss))

    def normalized(self, value: float) -> float:
        return value / self.reference

    @property
    def best_key(self) -> tuple[int, ...] | None:
        feasible = [r for r in self.records.values() if r.feasible]
        return max(feasible, key=lambda r: (self.value(r), -r.index)).key if feasible else None

    @property
    def best_value(self) -> float:
        key = self.best_key
        return self.value(self.records[key]) if key is not None else float("-inf")

    def lookup(self, key) -> float | None:
        rec = self.records.get(tuple(int(k) for k in key))
        if rec is None:
            return None
        return self.value(rec) if rec.feasible else -np.inf

    # ----- evaluating ---------------------------------------------------------------------------------
    def _simulate(self, key: tuple[int, ...]) -> Record:
        plan = self.actions.plan(key)
        result = self.journal.get(key) if self.journal is not None else None
        if result is None:  # not replayed from a resumed journal: simulate (and journal it)
            started = time.perf_counter()
            result = simulate_serving(self.ctx, plan, self.cfg, graph=self.graph, runtime=self.runtime)
            self.sim_wall_s += time.perf_counter() - started
            if self.journal is not None:
                self.journal.add(key, result)
        m = result.metrics
        if result.feasible:
            over = slo_miss(m.ttft_s["mean"], m.tpot_s["mean"], self.cfg.ttft_slo_s, self.cfg.tpot_slo_s)
            tput = m.output_tokens_per_s_per_gpu
        else:
            over, tput = (math.nan, math.nan, math.nan), math.nan
        rec = Record(key, plan, result, self.sims, tput, *over)
        self.sims += 1
        self.records[key] = rec
        return rec

    def evaluate_actions(self, actions: np.ndarray) -> Outcome:
        """Simulate proposals in order (memoized), stopping when the budget or the proposals run out."""
        actions = np.asarray(actions, dtype=np.int64).reshape(-1, self.actions.num_heads)
        inside = self.actions.inside(actions)
        keys, values, valid = [], [], []
        for row, ok in zip(actions.tolist(), inside.tolist(), strict=True):
            key = tuple(row)
            if self.exhausted or (ok and key not in self.records and self.sims >= self.budget):
                break
            self.proposals += 1
            self.order.append(key)
            rec = (self.records.get(key) or self._simulate(key)) if ok else None
            keys.append(row)
            values.append(float("nan") if rec is None else self.value(rec))
            valid.append(rec is not None and rec.feasible)
        if self.listener is not None:
            self.listener(self)
        return Outcome(np.array(keys, dtype=np.int64).reshape(-1, self.actions.num_heads), np.array(values, dtype=float),
                       np.array(valid, dtype=bool))

    def warm_start(self, seeds: bool = True) -> Outcome:
        """The Megatron-style plans at every ``max_num_seqs``, then (``seeds``) up to ``pool_seeds``
        disaggregated plans the pool-by-pool screening ranks first (:func:`planner.serving.poolwise.screen_plans`)
        and, within the same eighth of the budget, aggregated plans of their decode layouts, or of the
        decode screening's where there are none (:mod:`planner.serving.agg_seeds`); where the space holds
        both modes and the eighth two plans or more, one of them is left to an aggregated seed;
        sets :attr:`reference` to the best throughput of the former (met SLOs or not), else of the latter."""
        heuristic = np.array(self.actions.megatron())
        # the seeds take at most an eighth of the budget, so a small budget is left to the search itself
        eighth = self.budget // 8 if seeds and self.pool_seeds else 0
        both = MODE_VALUES.index("agg") in self.actions.modes and MODE_VALUES.index("disagg") in self.actions.modes
        kept_for_agg = 1 if both and eighth > 1 else 0
        screened = screen_plans(self.actions, self.cfg, min(self.pool_seeds, eighth - kept_for_agg))
        room = min(self.pool_seeds, eighth - len(screened))
        decodes = screened_decodes(screened) or screen_decodes(self.actions, self.cfg, room)
        extra = [s.action for s in screened] + aggregated_seeds(self.actions, decodes, room, self.cfg)
        out = self.evaluate_actions(np.concatenate([heuristic, np.array(extra, dtype=np.int64).reshape(-1, heuristic.shape[1])]))
        runs = [(k, self.records[tuple(k)].tokens_per_s_per_gpu) for k, ok in zip(out.keys.tolist(), out.valid, strict=True)
                if ok]
        megatron = {tuple(int(x) for x in a) for a in heuristic.tolist()}
        tputs = [t for k, t in runs if tuple(k) in megatron] or [t for _, t in runs]
        if tputs and max(tputs) > 0:
            self.reference = float(max(tputs))
        values = np.array([self.lookup(k) if ok else np.nan for k, ok in zip(out.keys, out.valid, strict=True)])
        return Outcome(out.keys, values, out.valid)

    # ----- reading ------------------------------------------------------------------------------------
    def ranked(self) -> list[Record]:
        """Simulated plans, best objective first (plans that cannot run last)."""
        return sorted(self.records.values(), key=lambda r: (not r.feasible, -np.nan_to_num(self.value(r), nan=-1e300),
                                                            r.index))

    def best_so_far(self) -> np.ndarray:
        """Best tokens/s/GPU meeting the SLOs after each simulation (NaN before the first)."""
        recs = sorted(self.records.values(), key=lambda r: r.index)
        vals = np.array([r.tokens_per_s_per_gpu if r.meets else -np.inf for r in recs])
        best = np.maximum.accumulate(vals) if len(vals) else vals
        return np.where(np.isfinite(best), best, np.nan)
