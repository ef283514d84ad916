"""The proxy behind a budget: every planner proposes strategies through one :class:`Evaluator`.

Every proposal counts as one call, including invalid strategies and strategies proposed before (the
paper's budget counts search rounds); a repeat is answered from a cache, so it costs a round but no
proxy time. Proposals the search space rules out (see :mod:`planner.actions`) count too and never
reach the proxy. The evaluator keeps the whole history (for ``candidates.csv`` and the search curve)
and the best valid strategy so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.actions import OUTSIDE_SPACE, ActionSpace
from planner.megatron import full_keys
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import reason_names
from simcore.cost.proxy import evaluate_batch
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS
from simcore.strategy.sharding import megatron_sharding

__all__ = ["Evaluator", "Outcome", "warm_start_keys"]

_OUTSIDE_MASK = -1  # reasons code of a proposal outside the search space


@dataclass
class Outcome:
    """Results of one batch of proposals (one entry per evaluated proposal, possibly fewer than asked
    when the budget ran out)."""

    keys: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    valid: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class Evaluator:
    """Counts calls against ``budget``, caches proxy results by strategy key, records the history.

    ``reference`` (tokens/s/GPU) normalizes throughput for rewards and acceptance rules so that one
    set of hyper-parameters fits every scenario; it is set once, from the warm start.
    """

    ctx: CostContext
    actions: ActionSpace
    budget: int
    reference: float = 1.0
    calls: int = 0
    proxy_evals: int = 0
    best_value: float = float("-inf")
    best_key: tuple | None = None
    history_keys: list = field(default_factory=list)
    history_value: list = field(default_factory=list)
    history_reasons: list = field(default_factory=list)
    _cache: dict = field(default_factory=dict, repr=False)
    listener: object = field(default=None, repr=False, compare=False)  # called after each batch

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "listener"} | {"listener": None}

    @property
    def remaining(self) -> int:
        return max(self.budget - self.calls, 0)

    @property
    def done(self) -> bool:
        return self.calls >= self.budget

    def lookup(self, key) -> float | None:
        """Proxy throughput of an already priced key (``-inf`` if it was invalid), ``None`` if never priced."""
        hit = self._cache.get(tuple(int(k) for k in key))
        if hit is None:
            return None
        return hit[0] if hit[1] == 0 else -np.inf

    def normalized(self, value: float) -> float:
        return value / self.reference

    def evaluate_actions(self, actions: np.ndarray) -> Outcome:
        """Price head-index proposals in order, stopping when the budget is spent."""
        actions = np.asarray(actions, dtype=np.int64).reshape(-1, self.actions.num_heads)
        keys, inside = self.actions.to_keys(actions[: self.remaining])
        return self._evaluate(keys, inside)

    def evaluate_keys(self, keys: np.ndarray) -> Outcome:
        """Price strategy keys in order, with or without the redundant-experts column (keys outside
        the search space count but are not priced); recorded in the action space's key width."""
        keys, inside = self.actions.fit_keys(full_keys(keys)[: self.remaining])
        return self._evaluate(keys, inside)

    def _evaluate(self, keys: np.ndarray, inside: np.ndarray) -> Outcome:
        tuples = [tuple(k) for k in keys.tolist()]
        fresh, seen = [], set()
        for i, t in enumerate(tuples):  # each new key priced once, in order of first appearance
            if inside[i] and t not in self._cache and t not in seen:
                seen.add(t)
                fresh.append(i)
        if fresh:
            result = evaluate_batch(self.ctx, StrategyArrays.from_keys(keys[fresh]))
            for j, i in enumerate(fresh):
                self._cache[tuples[i]] = (float(result.tokens_per_s_per_gpu[j]), int(result.reasons[j]))
            self.proxy_evals += len(fresh)
        values = np.empty(len(keys))
        valid = np.zeros(len(keys), dtype=bool)
        for i, t in enumerate(tuples):
            value, mask = self._cache[t] if inside[i] else (float("nan"), _OUTSIDE_MASK)
            values[i], valid[i] = value, mask == 0
            self.history_keys.append(t)
            self.history_value.append(value)
            self.history_reasons.append(mask)
            self.calls += 1
            if mask == 0 and value > self.best_value:
                self.best_value, self.best_key = value, t
        if self.listener is not None:
            self.listener(self)
        return Outcome(keys, values, valid)

    def warm_start(self) -> Outcome:
        """Evaluate the Megatron default at every batch size (:func:`warm_start_keys`), deepening the
        pipeline until something is valid; set :attr:`reference` to the best valid throughput."""
        outcome = Outcome(np.zeros((0, self.actions.key_width), dtype=np.int64), np.zeros(0),
                          np.zeros(0, dtype=bool))
        for pp in self.actions.space.pp:
            if self.done:
                break
            part = self.evaluate_keys(warm_start_keys(self.actions, pp))
            outcome = Outcome(np.concatenate([outcome.keys, part.keys]),
                              np.concatenate([outcome.tokens_per_s_per_gpu, part.tokens_per_s_per_gpu]),
                              np.concatenate([outcome.valid, part.valid]))
            if part.valid.any():
                break
        finite = outcome.tokens_per_s_per_gpu[np.isfinite(outcome.tokens_per_s_per_gpu)]
        if outcome.valid.any():
            self.reference = float(outcome.tokens_per_s_per_gpu[outcome.valid].max())
        elif len(finite) and finite.max() > 0:
            self.reference = float(finite.max())
        return outcome

    # ----- reading the history -------------------------------------------------------------------
    def reasons(self, index: int) -> list[str]:
        mask = self.history_reasons[index]
        return [OUTSIDE_SPACE] if mask == _OUTSIDE_MASK else reason_names(mask)

    def history(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every call in order: keys ``[n, key_width]`` (the action space's), tokens/s/GPU (NaN outside
        the space), reason masks (-1 outside the space)."""
        keys = np.array(self.history_keys, dtype=np.int64).reshape(-1, self.actions.key_width)
        return keys, np.array(self.history_value, dtype=float), np.array(self.history_reasons, dtype=np.int64)

    def best_so_far(self) -> np.ndarray:
        """Best valid tokens/s/GPU after each call (NaN before the first valid one)."""
        vals = np.array([v if r == 0 else -np.inf for v, r in zip(self.history_value, self.history_reasons,
                                                                    strict=True)])
        best = np.maximum.accumulate(vals) if len(vals) else vals
        return np.where(np.isfinite(best), best, np.nan)

    def top_valid(self, k: int) -> list[tuple[tuple, float]]:
        """The ``k`` best distinct valid strategies seen: ``(key, tokens/s/GPU)``, best first (ties by
        first appearance)."""
        seen: dict[tuple, float] = {}
        for t, v, r in zip(self.history_keys, self.history_value, self.history_reasons, strict=True):
            if r == 0 and t not in seen:
                seen[t] = v
        ranked = sorted(seen.items(), key=lambda kv: -kv[1])
        return ranked[:k]


def warm_start_keys(actions: ActionSpace, pp: int) -> np.ndarray:
    """The Megatron default at every batch size: Megatron sharding, ``tp`` as wide as the space
    allows (one node), ``ep`` as wide as the remaining GPUs allow, the given ``pp``, one microbatch,
    ``dp`` using the rest, no redundant experts. Empty when that degree combination is not in the
    space. Keys in the action space's key width."""
    space = actions.space
    tp = max(space.tp)
    fits = [e for e in space.ep if space.num_gpus % (tp * e * pp) == 0]
    if not fits:
        return np.zeros((0, actions.key_width), dtype=np.int64)
    ep = max(fits)
    codes = [CHOICES.index(megatron_sharding()[op]) for op in SEARCHABLE_OPS]
    rows = [[tp, ep, pp, space.num_gpus // (tp * ep * pp), b, 1, *codes] for b in space.batch]
    rows, inside = actions.fit_keys(np.array(rows, dtype=np.int64).reshape(-1, len(codes) + 6))
    return rows[inside]
