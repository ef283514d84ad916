"""The strategies the fidelity study prices: Megatron's best, a search trajectory, random valid ones.

Three sources, de-duplicated in this order (a strategy keeps the first source that proposed it):

- ``megatron``: the Megatron heuristic's best valid strategies (:func:`planner.megatron.megatron_search`
  over the whole degree grid, Megatron sharding), up to ``n // 8``;
- ``search``: the distinct valid strategies the PPO planner proposed (:class:`planner.search.PPOSearch`,
  default hyper-parameters, one chunk of ``search_budget`` proposals after its warm start), up to
  ``2n / 5`` (the proxy-best half of the cap, the rest drawn at random from the trajectory);
- ``random``: uniform over the degree grid and per-operator choices
  (:func:`validation.studies.common.scenarios.random_keys`), kept when the proxy finds them valid.

Operators the model lacks are set to Megatron's choice, so no two keys price the same strategy.
"""

from __future__ import annotations

import numpy as np

from planner.actions import ActionSpace
from planner.config import PlannerConfig
from planner.evaluator import Evaluator
from planner.megatron import megatron_search
from planner.space import SearchSpace
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.proxy import evaluate_batch
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS, op_applies
from simcore.strategy.sharding import megatron_sharding
from validation.studies.common.scenarios import random_keys

__all__ = ["SOURCES", "canonical", "search_trajectory", "sample_strategies"]

SOURCES = ("megatron", "search", "random")
_WIDTH = 6 + len(SEARCHABLE_OPS)


def canonical(ctx: CostContext, keys: np.ndarray) -> np.ndarray:
    """``keys`` with the choices of operators the model lacks set to Megatron's."""
    keys = np.array(keys, dtype=np.int64).reshape(-1, _WIDTH)
    for i, op in enumerate(SEARCHABLE_OPS):
        if not op_applies(ctx.model, op):
            keys[:, 6 + i] = CHOICES.index(megatron_sharding()[op])
    return keys


def search_trajectory(ctx: CostContext, budget: int, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Distinct valid strategies the PPO planner proposed (first-appearance order), their proxy
    throughput, and a note on the source ("none: why" when the planner cannot run here)."""
    empty = np.zeros((0, _WIDTH), dtype=np.int64), np.zeros(0)
    if budget < 1:
        return (*empty, "none: search budget 0")
    try:
        from planner.search import PPOSearch
    except ImportError as exc:
        return (*empty, f"none: PPO planner unavailable ({exc})")
    actions = ActionSpace(ctx, SearchSpace.for_context(ctx))
    ev = Evaluator(ctx, actions, budget)
    search = PPOSearch(actions, PlannerConfig(budget=budget), seed)
    search.start(ev)
    search.run(ev, budget, lambda: False)
    seen: dict[tuple, float] = {}
    for key, value, reason in zip(ev.history_keys, ev.history_value, ev.history_reasons, strict=True):
        if reason == 0 and key not in seen:
            seen[key] = value
    keys = np.array(list(seen), dtype=np.int64).reshape(-1, _WIDTH)
    note = f"PPO planner, {ev.calls} proposals, {len(seen)} distinct valid, best {ev.best_value:.1f} tokens/s/GPU"
    return keys, np.array(list(seen.values()), dtype=float), note


def _cap(keys: np.ndarray, values: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``cap`` rows: the best half by value, the rest drawn at random."""
    if len(keys) <= cap:
        return keys
    order = np.argsort(-values, kind="stable")
    best, rest = order[: cap // 2], order[cap // 2:]
    return keys[np.concatenate([best, rng.choice(rest, cap - len(best), replace=False)])]


def _random_valid(ctx: CostContext, space: SearchSpace, want: int, taken: set, seed: int) -> list[tuple]:
    out: list[tuple] = []
    for round_ in range(20):
        if len(out) >= want:
            break
        keys = canonical(ctx, random_keys(space, max(4 * want, 1000), seed=[seed, round_]))
        valid = evaluate_batch(ctx, StrategyArrays.from_keys(keys)).valid
        for key in map(tuple, keys[valid].tolist()):
            if key not in taken and len(out) < want:
                taken.add(key)
                out.append(key)
    return out


def sample_strategies(ctx: CostContext, n: int, seed: int = 0, search_budget: int = 200
                      ) -> tuple[np.ndarray, list[str], str]:
    """``n`` distinct proxy-valid strategy keys, the source of each, and the trajectory note."""
    if n < 1:
        raise ValueError(f"strategies must be >= 1, got {n}")
    space = SearchSpace.for_context(ctx)
    rng = np.random.default_rng([seed, 7])
    ranked = megatron_search(ctx, space)
    megatron = canonical(ctx, ranked.keys[ranked.order[: min(ranked.num_valid, max(n // 8, 1))]])
    traj, values, note = search_trajectory(ctx, search_budget, seed)
    search = _cap(canonical(ctx, traj), values, (2 * n) // 5, rng)
    taken: set = set()
    keys: list[tuple] = []
    sources: list[str] = []
    for source, rows in (("megatron", megatron), ("search", search)):
        for key in map(tuple, rows.tolist()):
            if key not in taken and len(keys) < n:
                taken.add(key)
                keys.append(key)
                sources.append(source)
    extra = _random_valid(ctx, space, n - len(keys), taken, seed)
    keys += extra
    sources += ["random"] * len(extra)
    return np.array(keys, dtype=np.int64).reshape(-1, _WIDTH), sources, note
