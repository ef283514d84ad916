"""Re-ranking: the best strategies the proxy found, re-evaluated by a slower, more faithful evaluator.

The answer of a search is the re-ranker's best among the top ``K`` distinct valid strategies (elite
included). A plan the re-ranker finds invalid (over HBM, an SLO missed on simulated times) is kept, with
its reasons, but never ranked: its ``rank`` is 0 and it is never the answer. The re-ranker is any callable ``Strategy -> float`` (tokens/s/GPU) or ``Strategy -> result``
with ``tokens_per_s_per_gpu`` and ``valid``. ``"sim"`` (the default) is the discrete-event simulator,
``simcore.engine.simulate(ctx, graph, strategy, engine)`` on the scenario's network; ``"proxy"``
re-evaluates with the proxy itself (the rankings then agree: a cheap switch for tests and sweeps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from planner.megatron import canonical_key, strategy_from_key
from simcore.config import ConfigError
from simcore.cost.lowering import CostContext
from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, simulate
from simcore.strategy.sharding import Strategy

__all__ = ["Reranked", "rerank", "rerank_search", "make_reranker", "rank_valid", "best_valid"]


@dataclass
class Reranked:
    """One candidate: proxy value and rank, re-ranker value and rank (1 = best; 0 = invalid, not
    ranked) and, when the re-ranker finds it invalid, its reasons."""

    strategy: Strategy
    proxy_tokens_per_s_per_gpu: float
    proxy_rank: int
    tokens_per_s_per_gpu: float
    valid: bool
    rank: int = 0
    reasons: list[str] = field(default_factory=list)


def make_reranker(ctx: CostContext, name: str, graph=None, engine=None) -> Callable[[Strategy], object]:
    """The evaluator called ``name`` (``proxy`` or ``sim``) bound to ``ctx``; ``sim`` also needs the
    cluster's ``graph`` (a topology) and an ``EngineConfig`` (``None`` = contention and overlap on)."""
    if name == "proxy":
        return lambda strategy: evaluate(ctx, strategy)
    if name == "sim":

        if graph is None:
            raise ConfigError("planner.reranker: 'sim' needs the scenario's topology graph")
        engine = engine or EngineConfig()
        return lambda strategy: simulate(ctx, graph, strategy, engine)
    raise ConfigError(f"planner.reranker: {name!r} is not one of proxy, sim")


def _verdict(result) -> tuple[float, bool, list[str]]:
    """``(tokens/s/GPU, valid, reasons)`` of a re-ranker's result (a bare number is valid)."""
    if isinstance(result, int | float):
        return float(result), True, []
    valid = bool(getattr(result, "valid", True))
    return float(result.tokens_per_s_per_gpu), valid, [] if valid else list(getattr(result, "reasons", []))


def rank_valid(out: list[Reranked]) -> list[Reranked]:
    """Sort best first by the re-ranker (valid first, ties kept in proxy order) and number the valid
    ones 1, 2, ...; an invalid one keeps rank 0 (not ranked)."""
    out.sort(key=lambda r: (not r.valid, -r.tokens_per_s_per_gpu if r.valid else 0.0, r.proxy_rank))
    for i, r in enumerate(out, 1):
        r.rank = i if r.valid else 0
    return out


def best_valid(reranked: list[Reranked]) -> Reranked | None:
    """The answer: the re-ranker's best valid plan, or None when it found none valid."""
    return next((r for r in reranked if r.valid), None)


def rerank(candidates: list[tuple[Strategy, float]], evaluator: Callable[[Strategy], object]) -> list[Reranked]:
    """Re-evaluate ``(strategy, proxy tokens/s/GPU)`` pairs (given best first by the proxy); return
    them best first by the evaluator (:func:`rank_valid`)."""
    out = []
    for i, (strategy, proxy_value) in enumerate(candidates, 1):
        value, valid, reasons = _verdict(evaluator(strategy))
        out.append(Reranked(strategy, float(proxy_value), i, value, valid, reasons=reasons))
    return rank_valid(out)


def rerank_search(ctx: CostContext, result, k: int, evaluator: Callable[[Strategy], object]) -> list[Reranked]:
    """Re-rank a search's ``k`` best distinct plans (elite included; see ``SearchResult.top_valid``)."""
    top = result.top_valid(k, lambda key: canonical_key(key, ctx.model))
    return rerank([(strategy_from_key(key), value) for key, value in top], evaluator)
