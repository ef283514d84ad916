"""One serving search on one scenario: the plan space a ``serving.search`` node describes, checked, and
a method run on it (``shard-search workload=serving`` runs it, :mod:`planner.apps.serving_search`)."""

from __future__ import annotations

from planner.config import PlannerConfig
from planner.errors import UserError
from planner.serving.evaluator import ServingEvaluator
from planner.serving.methods import METHODS, method_config, run_method
from planner.serving.space import ServingSpace

__all__ = ["search_plans", "serving_space", "check_serving_planner"]


def serving_space(ctx, scfg, search, method: str) -> ServingSpace:
    """The plan space ``search`` (a ``serving.search`` node) describes, after checking ``method`` and the
    budget: bad values are one-line errors naming the field, raised before anything is written."""
    if method not in METHODS:
        raise UserError(f"planner.name: {method!r} is not a serving method; choose one of {', '.join(METHODS)}")
    if int(search.budget) < 1:
        raise UserError(f"serving.search.budget must be >= 1, got {search.budget}")
    if int(search.get("pool_seeds", 4)) < 0:
        raise UserError(f"serving.search.pool_seeds must be >= 0, got {search.pool_seeds}")
    if int(search.max_proposals) < 1:
        raise UserError(f"serving.search.max_proposals must be >= 1, got {search.max_proposals}")
    if int(search.pareto_plans) < 0:
        raise UserError(f"serving.search.pareto_plans must be >= 0, got {search.pareto_plans}")
    for name in ("tp", "ep"):  # null: every degree; an empty list would silently mean the same
        if search.get(name) is not None and len(search[name]) == 0:
            raise UserError(f"serving.search.{name}: an empty list; give the degrees to search, or null for all")
    for name in ("tp", "ep", "pp", "max_num_seqs"):
        values = [] if search.get(name) is None else list(search[name])
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise UserError(f"serving.search.{name} must list positive integers, got {values}")
        if name in ("pp", "max_num_seqs") and not values:
            raise UserError(f"serving.search.{name}: an empty list; give the values to search")
    for name, unit in (("loads", "multiples of the configured load"), ("tpot_grid_ms", "TPOT targets in ms")):
        bad = [x for x in search[name] if not float(x) > 0]
        if bad:
            raise UserError(f"serving.search.{name} must list positive {unit}, got {list(search[name])}")
    longest = int(scfg.input_len.mean + scfg.output_len.mean)
    return ServingSpace(ctx, scfg.runtime_profile(), max_len=longest, tp=search.tp, ep=search.ep,
                        pp=tuple(search.pp), max_num_seqs=tuple(search.max_num_seqs), modes=tuple(search.modes),
                        spec_tokens=None if search.get("spec_tokens") is None else list(search.spec_tokens),
                        moe_ep=None if search.get("moe_ep") is None else list(search.moe_ep))


def check_serving_planner(pcfg) -> None:
    """The ``planner`` node of a serving search: its method settings by the static search's rules
    (:func:`~planner.serving.methods.method_config`), and ``planner.budget`` left alone, since a serving
    search spends ``serving.search.budget`` simulations instead (a changed ``planner.budget`` would
    otherwise be ignored without a word)."""
    if int(pcfg.budget) != PlannerConfig().budget:
        raise UserError(f"planner.budget does not apply to workload=serving, got {pcfg.budget}: "
                        f"set serving.search.budget (simulations) instead")
    method_config(pcfg)


def search_plans(ctx, scfg, search, method: str, seed: int, graph=None, pcfg=None, stop=None, journal=None,
                 space: ServingSpace | None = None) -> tuple[ServingEvaluator, dict]:
    """Run ``method`` on the space ``search`` (a ``serving.search`` node) describes (``space``: that space,
    built already by :func:`serving_space`); returns the evaluator (every simulated plan) and what the
    method reports. ``journal`` keeps (and, resumed, replays) the simulations."""
    space = space or serving_space(ctx, scfg, search, method)
    runtime = scfg.runtime_profile()
    ev = ServingEvaluator(ctx, space, scfg, int(search.budget), graph=graph, runtime=runtime,
                          max_proposals=int(search.max_proposals) * int(search.budget), journal=journal,
                          pool_seeds=int(search.get("pool_seeds", 4)))
    info = run_method(method, ev, method_config(pcfg), seed, stop=stop, exact_limit=int(search.exact_limit))
    return ev, info
