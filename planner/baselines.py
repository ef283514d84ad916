"""Metaheuristic baselines on the same action space, masks, evaluator and budget as PPO.

Every method starts from the same warm start (the Megatron default at every batch size, see
:meth:`planner.evaluator.Evaluator.warm_start`) and scores strategies as PPO's reward does without the
best-so-far term: ``raw = tokens/s/GPU / reference`` if valid, else ``invalid_reward``.

- :class:`RandomSearch`: uniform proposals (head by head over the masks).
- :class:`RandomWalk` (the paper's normalization baseline): move to a random neighbour (one head
  changed) whenever it is valid, better or not.
- :class:`Annealing`: Metropolis acceptance on ``100 * score`` (percent of the reference) at a
  temperature cosine-annealed from ``t0`` (the paper: 100) to 0 over the budget.
- :class:`Genetic`: generational GA with elitism, tournament selection, uniform crossover and
  per-head mutation; children are repaired to satisfy the masks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from planner.actions import ActionSpace
from planner.evaluator import Evaluator

__all__ = ["RandomSearch", "RandomWalk", "Annealing", "Genetic", "neighbor"]


def neighbor(actions: ActionSpace, action: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Change one head (picked uniformly among those with an alternative) to another allowed value,
    then repair the heads after it."""
    action = np.array(action, dtype=np.int64).reshape(1, -1)
    for i in rng.permutation(actions.num_heads):
        allowed = np.flatnonzero(actions.head_mask(int(i), action)[0])
        allowed = allowed[allowed != action[0, i]]
        if len(allowed):
            action[0, i] = allowed[rng.integers(len(allowed))]
            return actions.repair(action, rng)[0]
    return action[0]


class _Base:
    name = "base"

    def __init__(self, actions: ActionSpace, cfg, seed: int) -> None:
        self.actions, self.cfg, self.seed = actions, cfg, int(seed)
        self.rng = np.random.default_rng([self.seed, 3])
        self.current: np.ndarray | None = None
        self.current_score = -math.inf

    def score(self, ev: Evaluator, value: float, valid: bool) -> float:
        return ev.normalized(value) if valid else float(self.cfg.invalid_reward)

    def start(self, ev: Evaluator) -> None:
        """Evaluate the warm start; start from its best (valid first, then the earliest)."""
        out = ev.warm_start()
        if len(out) == 0:
            self.current = self.actions.sample(None, self.rng)[0]
            return
        scores = [self.score(ev, v, ok) for v, ok in zip(out.tokens_per_s_per_gpu, out.valid, strict=True)]
        i = int(np.argmax(scores))
        self.current, self.current_score = self.actions.from_keys(out.keys[i: i + 1])[0], scores[i]

    def _propose(self, ev: Evaluator, action: np.ndarray) -> tuple[float, bool] | None:
        out = ev.evaluate_actions(action[None])
        if len(out) == 0:
            return None
        return self.score(ev, float(out.tokens_per_s_per_gpu[0]), bool(out.valid[0])), bool(out.valid[0])


class RandomSearch(_Base):
    name = "random"

    def run(self, ev: Evaluator, until: int, stop: Callable[[], bool]) -> None:
        while ev.calls < min(until, ev.budget) and not stop():
            n = min(64, min(until, ev.budget) - ev.calls)
            ev.evaluate_actions(self.actions.sample(None, self.rng, n))


class RandomWalk(_Base):
    name = "random-walk"

    def run(self, ev: Evaluator, until: int, stop: Callable[[], bool]) -> None:
        while ev.calls < min(until, ev.budget) and not stop():
            candidate = neighbor(self.actions, self.current, self.rng)
            result = self._propose(ev, candidate)
            if result is not None and result[1]:
                self.current, self.current_score = candidate, result[0]


class Annealing(_Base):
    name = "annealing"

    def temperature(self, ev: Evaluator) -> float:
        return self.cfg.t0 * 0.5 * (1.0 + math.cos(math.pi * min(ev.calls / ev.budget, 1.0)))

    def run(self, ev: Evaluator, until: int, stop: Callable[[], bool]) -> None:
        while ev.calls < min(until, ev.budget) and not stop():
            candidate = neighbor(self.actions, self.current, self.rng)
            temp = self.temperature(ev)
            result = self._propose(ev, candidate)
            if result is None:
                return
            delta = 100.0 * (result[0] - self.current_score)
            if delta >= 0 or (temp > 0 and self.rng.random() < math.exp(delta / temp)):
                self.current, self.current_score = candidate, result[0]


class Genetic(_Base):
    name = "genetic"

    def start(self, ev: Evaluator) -> None:
        """Warm start, then fill the population with uniform proposals."""
        out = ev.warm_start()
        pop = list(self.actions.from_keys(out.keys)) if len(out) else []
        scores = [self.score(ev, v, ok) for v, ok in zip(out.tokens_per_s_per_gpu, out.valid, strict=True)]
        need = max(self.cfg.population - len(pop), 0)
        if need:
            fresh = ev.evaluate_actions(self.actions.sample(None, self.rng, need))
            pop += list(self.actions.from_keys(fresh.keys))
            scores += [self.score(ev, v, ok) for v, ok in zip(fresh.tokens_per_s_per_gpu, fresh.valid, strict=True)]
        order = np.argsort(-np.array(scores), kind="stable")[: self.cfg.population]
        self.population = np.array([pop[i] for i in order], dtype=np.int64)
        self.scores = np.array([scores[i] for i in order])

    def _select(self) -> np.ndarray:
        k = min(self.cfg.tournament, len(self.population))
        picks = self.rng.choice(len(self.population), size=k, replace=False)
        return self.population[picks[np.argmax(self.scores[picks])]]

    def _child(self) -> np.ndarray:
        a, b = self._select(), self._select()
        child = np.where(self.rng.random(self.actions.num_heads) < 0.5, a, b)
        rate = self.cfg.mutation if self.cfg.mutation is not None else 1.0 / self.actions.num_heads
        for i in np.flatnonzero(self.rng.random(self.actions.num_heads) < rate):
            allowed = np.flatnonzero(self.actions.head_mask(int(i), child[None])[0])
            child[i] = allowed[self.rng.integers(len(allowed))]
        return self.actions.repair(child[None], self.rng)[0]

    def run(self, ev: Evaluator, until: int, stop: Callable[[], bool]) -> None:
        elite = min(self.cfg.elitism, len(self.population))
        while ev.calls < min(until, ev.budget) and not stop():
            n = min(self.cfg.population - elite, min(until, ev.budget) - ev.calls)
            children = np.array([self._child() for _ in range(n)], dtype=np.int64)
            out = ev.evaluate_actions(children)
            scores = np.array([self.score(ev, v, ok) for v, ok in zip(out.tokens_per_s_per_gpu, out.valid,
                                                                       strict=True)])
            pool = np.concatenate([self.population[:elite], children[: len(out)]])
            pool_scores = np.concatenate([self.scores[:elite], scores])
            if len(out) < n:  # budget ran out mid-generation: keep the best of everything seen
                pool = np.concatenate([pool, self.population[elite:]])
                pool_scores = np.concatenate([pool_scores, self.scores[elite:]])
            order = np.argsort(-pool_scores, kind="stable")[: self.cfg.population]
            self.population, self.scores = pool[order], pool_scores[order]
