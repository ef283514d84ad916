"""Run any planner by name and get one result type back.

Iterative planners (PPO and the metaheuristics) are driven chunk by chunk: ``start`` (the warm start),
then ``run(evaluator, until, stop)`` once per chunk of the budget, with a checkpoint after the warm
start and after every chunk. A stop request (SIGINT/SIGTERM) ends the run between two proposals with
:class:`SearchInterrupted`; the checkpoint on disk is the last complete chunk, and resuming from it
replays the interrupted chunk exactly, so a resumed run ends with the same result as an uninterrupted
one. The Megatron heuristic and the exact optimum are one-shot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from planner.actions import ActionSpace
from planner.baselines import Annealing, Genetic, RandomSearch, RandomWalk
from planner.checkpoint import config_difference, load_checkpoint, save_checkpoint
from planner.evaluator import Evaluator
from planner.exact import exact_optimum
from planner.megatron import full_keys, megatron_search, strategy_from_key
from planner.search import PPOSearch
from planner.space import SearchSpace
from simcore.cost.lowering import CostContext
from simcore.strategy.sharding import Strategy

__all__ = ["ITERATIVE", "SearchResult", "SearchInterrupted", "make_actions", "run_planner"]

ITERATIVE = {cls.name: cls for cls in (PPOSearch, RandomSearch, RandomWalk, Annealing, Genetic)}


class SearchInterrupted(Exception):
    """The search stopped on request; ``chunks_done`` chunks are in the checkpoint."""

    def __init__(self, chunks_done: int, run_dir: Path | None):
        super().__init__(f"interrupted after {chunks_done} complete chunk(s)")
        self.chunks_done, self.run_dir = chunks_done, run_dir


@dataclass
class SearchResult:
    """What a planner did: every evaluated strategy in order and the best valid one."""

    planner: str
    seed: int
    calls: int
    proxy_evals: int
    wall_s: float
    keys: np.ndarray                  # [n, KEY_WIDTH] (Strategy.key() rows) in evaluation order
    values: np.ndarray                # tokens/s/GPU (NaN outside the search space)
    reasons: np.ndarray               # reason bitmask, -1 outside the search space
    best_key: tuple | None
    best_value: float
    metrics: list[dict] = field(default_factory=list)
    elite_keys: list[tuple] = field(default_factory=list)

    @property
    def best_strategy(self) -> Strategy | None:
        return None if self.best_key is None else strategy_from_key(self.best_key)

    def curve(self) -> np.ndarray:
        """Best valid tokens/s/GPU after each evaluation (NaN before the first valid one)."""
        vals = np.where(self.reasons == 0, self.values, -np.inf)
        best = np.maximum.accumulate(vals) if len(vals) else vals
        return np.where(np.isfinite(best), best, np.nan)

    def top_valid(self, k: int, canonical: Callable[[tuple], tuple] | None = None) -> list[tuple[tuple, float]]:
        """The ``k`` best distinct valid strategies, best first, plus any elite not among them;
        ``canonical`` maps keys that denote the same plan to one (e.g. :func:`canonical_key`)."""
        canon = canonical or (lambda key: key)
        seen: dict[tuple, float] = {}
        for key, v, r in zip(map(tuple, self.keys.tolist()), self.values, self.reasons, strict=True):
            c = canon(key)
            if r == 0 and c not in seen:
                seen[c] = float(v)
        ranked = sorted(seen.items(), key=lambda kv: -kv[1])
        top = ranked[:k]
        chosen = {key for key, _ in top}
        elite = (canon(key) for key in self.elite_keys)
        top += [(key, seen[key]) for key in dict.fromkeys(elite) if key in seen and key not in chosen]
        return top


def make_actions(ctx: CostContext, space: SearchSpace, pcfg) -> ActionSpace:
    return ActionSpace(ctx, space, dp_head=bool(pcfg.dp_head), microbatch_head=bool(pcfg.microbatch_head),
                       masking=bool(pcfg.masking))


def _chunk_ends(budget: int, chunks: int) -> list[int]:
    return [-(-budget * (k + 1) // chunks) for k in range(chunks)]


def _iterative(ctx, space, pcfg, seed, run_dir, config, resume, stop, listener) -> SearchResult:
    actions = make_actions(ctx, space, pcfg)
    external = {"ctx": ctx, "actions": actions}
    started = time.perf_counter()
    if resume:
        state = load_checkpoint(run_dir, external)
        diff = config_difference(state["config"], config)
        if diff:
            raise ValueError(f"resume: {run_dir} was made with a different config ({diff})")
        planner, ev, chunk, wall_before = state["planner"], state["evaluator"], state["chunk"], state["wall_s"]
    else:
        ev = Evaluator(ctx, actions, int(pcfg.budget))
        planner = ITERATIVE[pcfg.name](actions, pcfg, seed)
        ev.listener = listener
        planner.start(ev)
        chunk, wall_before = 0, 0.0
    ev.listener = listener

    def checkpoint(done: int) -> None:
        if run_dir is not None:
            save_checkpoint(run_dir, {"config": config, "planner": planner, "evaluator": ev, "chunk": done,
                                      "wall_s": wall_before + time.perf_counter() - started}, external)

    if not resume:
        checkpoint(0)
    for k, end in enumerate(_chunk_ends(int(pcfg.budget), int(pcfg.chunks))):
        if k < chunk:
            continue
        planner.run(ev, end, stop)
        if stop():
            raise SearchInterrupted(k, run_dir)
        checkpoint(k + 1)
    keys, values, reasons = ev.history()
    elite = getattr(planner, "elite", None)
    elite_keys = []
    if elite is not None and elite.records:
        elite_keys = [tuple(k) for k in full_keys(actions.to_keys(np.array([a for _, a in elite.records]))[0]).tolist()]
    best_key = None if ev.best_key is None else tuple(int(v) for v in full_keys(ev.best_key)[0])
    return SearchResult(pcfg.name, seed, ev.calls, ev.proxy_evals, wall_before + time.perf_counter() - started,
                        full_keys(keys), values, reasons, best_key, ev.best_value if ev.best_key else float("nan"),
                        list(getattr(planner, "metrics", [])), elite_keys)


def run_planner(ctx: CostContext, space: SearchSpace, pcfg, seed: int, *, run_dir: str | Path | None = None,
                config: dict | None = None, resume: bool = False, stop: Callable[[], bool] | None = None,
                listener: Callable[[Evaluator], None] | None = None) -> SearchResult:
    """Run planner ``pcfg.name`` on ``space``; iterative planners checkpoint into ``run_dir`` (if
    given) and ``resume`` continues from its checkpoint, refusing one made with another ``config``."""
    stop = stop or (lambda: False)
    if pcfg.name in ITERATIVE:
        return _iterative(ctx, space, pcfg, int(seed), None if run_dir is None else Path(run_dir), config or {},
                          resume, stop, listener)
    started = time.perf_counter()
    if pcfg.name == "megatron":
        ranked = megatron_search(ctx, space)
        keys, r = ranked.keys, ranked.result
        values, reasons, calls = r.tokens_per_s_per_gpu, r.reasons, ranked.calls
    elif pcfg.name == "exact":
        ex = exact_optimum(ctx, space)
        keys, values, reasons, calls = ex.keys, ex.values, ex.reasons, ex.calls
    else:
        raise ValueError(f"planner.name: {pcfg.name!r} is not a known planner")
    keys = full_keys(keys)
    score = np.where(reasons == 0, values, -np.inf)
    best = int(np.argmax(score)) if len(score) and np.isfinite(score.max()) else None
    return SearchResult(pcfg.name, int(seed), int(calls), int(calls), time.perf_counter() - started, keys,
                        np.asarray(values, dtype=float), np.asarray(reasons, dtype=np.int64),
                        None if best is None else tuple(int(v) for v in keys[best]),
                        float("nan") if best is None else float(values[best]))
