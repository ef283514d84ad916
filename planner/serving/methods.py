"""The serving search methods, all on one :class:`~planner.serving.evaluator.ServingEvaluator` and budget.

- ``ppo``: :class:`planner.search.PPOSearch` on the serving heads (the attention policy over the elite
  history, PPO updates, early exit and fresh networks), without the static planner's polish (its
  neighbourhoods are the per-operator moves of the static space) and without the diverse elite;
- ``random``, ``random-walk``, ``annealing``, ``genetic``: :mod:`planner.baselines` unchanged;
- ``megatron``: the Megatron-style heuristic alone (:meth:`ServingSpace.megatron`);
- ``poolwise``: the warm start alone: the Megatron-style plans and the disaggregated plans that a pool-by-pool
  screening ranks first (DistServe's placement, aiconfigurator's disaggregated search;
  :mod:`planner.serving.poolwise`), and the aggregated seeds (:mod:`planner.serving.agg_seeds`), each simulated;
- ``exact``: every plan of the space, when it holds at most ``exact_limit``;
- ``tpe``, ``cmaes``: Optuna's samplers (the optional extra ``.[optuna]``; CMA-ES needs ``cmaes``),
  one integer parameter per head, each proposal projected onto the masks (:meth:`ServingSpace.project`).

Every method but ``megatron`` starts from the same warm start (the heuristic's plans, the pool-by-pool
seeds, ``serving.search.pool_seeds`` of them, and the aggregated seeds of :mod:`planner.serving.agg_seeds`) and stops when the budget of simulations is spent.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

from planner.baselines import Annealing, Genetic, RandomSearch, RandomWalk
from planner.config import check_planner_settings, method_defaults
from planner.search import PPOSearch
from planner.serving.evaluator import ServingEvaluator

__all__ = ["METHODS", "run_method", "method_config"]

_ITERATIVE = {"ppo": PPOSearch, "random": RandomSearch, "random-walk": RandomWalk, "annealing": Annealing,
              "genetic": Genetic}
METHODS = (*_ITERATIVE, "megatron", "poolwise", "exact", "tpe", "cmaes")


def method_config(pcfg=None, **overrides) -> SimpleNamespace:
    """The knobs a method reads: every planner schema's defaults (:func:`~planner.config.method_defaults`),
    then the fields ``pcfg`` has (a composed ``planner`` node, whose option's schema holds that method's
    knobs, or any object), then ``overrides``. PPO's polish and diverse elite are off (see the module
    docstring). A bad setting is a :class:`~simcore.config.ConfigError` naming the field
    (:func:`~planner.config.check_planner_settings`, the static search's rules): a population of 0 would
    otherwise never spend the budget; so is a ``planner.name`` that is not its option's method."""
    base = method_defaults()
    if pcfg is not None:
        check_planner_settings(pcfg)
        base |= {k: getattr(pcfg, k) for k in base if hasattr(pcfg, k)}
    cfg = SimpleNamespace(**(base | {"polish": False, "elite_diverse": False} | overrides))
    check_planner_settings(cfg)
    return cfg


def run_method(name: str, ev: ServingEvaluator, cfg: SimpleNamespace, seed: int,
               stop: Callable[[], bool] | None = None, exact_limit: int = 3000) -> dict:
    """Run method ``name`` until ``ev``'s budget is spent; returns what it reports beyond ``ev``
    (PPO's per-update metrics, the space size for ``exact``)."""
    stop = stop or (lambda: False)
    if name in _ITERATIVE:
        planner = _ITERATIVE[name](ev.actions, cfg, seed)
        planner.start(ev)
        planner.run(ev, ev.budget, stop)
        return {"metrics": list(getattr(planner, "metrics", []))}
    if name in ("megatron", "poolwise"):
        ev.warm_start(seeds=name == "poolwise")
        return {}
    if name == "exact":
        size = ev.actions.size
        if size > exact_limit:
            raise ValueError(f"planner=exact: the space holds {size} plans, above serving.search.exact_limit="
                             f"{exact_limit}; narrow serving.search.* or raise the limit")
        ev.budget = size
        ev.max_proposals = max(ev.max_proposals, 2 * size + 1)  # the warm start proposes some twice
        ev.warm_start()
        ev.evaluate_actions(ev.actions.enumerate())
        return {"space_size": size}
    if name in ("tpe", "cmaes"):
        return _optuna(name, ev, seed, stop)
    raise ValueError(f"planner.name: {name!r} is not a serving method; choose one of {', '.join(METHODS)}")


def _optuna(name: str, ev: ServingEvaluator, seed: int, stop: Callable[[], bool]) -> dict:
    try:
        import optuna
    except ImportError:
        raise ValueError(f"planner={name} needs Optuna: pip install -e '.[optuna]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = ev.actions
    if name == "tpe":
        sampler = optuna.samplers.TPESampler(seed=seed)
    else:
        try:
            import cmaes  # noqa: F401  (Optuna's CMA-ES sampler imports it lazily)
        except ImportError:
            raise ValueError("planner=cmaes needs the cmaes package: pip install -e '.[optuna]'") from None
        sampler = optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    warm = ev.warm_start()
    for key in warm.keys:  # the same warm start as every other method (memoized: no simulation)
        study.enqueue_trial({h.name: int(k) for h, k in zip(space.heads, key, strict=True)})
    worst = -1.0

    def objective(trial) -> float:
        raw = [trial.suggest_int(h.name, 0, h.size - 1) for h in space.heads]
        out = ev.evaluate_actions(space.project(raw)[None])
        if len(out) == 0:
            trial.study.stop()
            return worst
        return ev.normalized(float(out.tokens_per_s_per_gpu[0])) if out.valid[0] else worst

    def halt(study, _trial) -> None:
        if ev.done or stop():
            study.stop()

    study.optimize(objective, n_trials=ev.max_proposals, callbacks=[halt])
    return {"trials": len(study.trials)}


def random_plans(ev: ServingEvaluator, n: int, seed: int) -> np.ndarray:
    """``n`` uniform proposals (head by head over the masks), for tests and comparisons."""
    return ev.actions.sample(None, np.random.default_rng(seed), n)
