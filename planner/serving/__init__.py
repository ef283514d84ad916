"""Serving plan search: the best aggregated or disaggregated plan under TTFT and TPOT SLOs.

Entry point: :func:`search_plans` (one method on one scenario); ``shard-search workload=serving`` runs
it (:mod:`planner.apps.serving_search`).

- :mod:`.space`: the plan space as categorical heads (mode, each pool's degrees and workers,
  max_num_seqs, speculative decoding's draft tokens) with conditional masks; Megatron's per-operator sharding in every pool
- :mod:`.evaluator`: memoized ``simulate_serving`` behind a budget of simulations; the objective
  (tokens/s per GPU under the SLOs, a graded penalty for misses)
- :mod:`.poolwise`: disaggregated seeds chosen pool by pool (DistServe's placement) for every warm start
- :mod:`.methods`: PPO, the metaheuristics, the Megatron-style heuristic, the warm start alone, exact
  enumeration, Optuna's TPE and CMA-ES
- :mod:`.pareto`: the front across loads, the best plan per SLO, the closest misses
"""

from planner.serving.evaluator import Record, ServingEvaluator, slo_miss
from planner.serving.methods import METHODS, method_config, run_method
from planner.serving.pareto import best_per_slo, closest_misses, pareto_mask, sweep_loads
from planner.serving.poolwise import pool_seeds
from planner.serving.search import search_plans
from planner.serving.space import ServingSpace

__all__ = ["search_plans", "ServingSpace", "ServingEvaluator", "Record", "slo_miss",
           "METHODS", "method_config", "run_method", "pareto_mask", "sweep_loads", "best_per_slo", "closest_misses",
           "pool_seeds"]
