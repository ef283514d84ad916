"""Re-ranking: the best strategies the proxy found, re-evaluated by a slower, more faithful evaluator.

The answer of a search is the re-ranker's best among the top ``K`` distinct valid strategies (elite
included). The re-ranker is any callable ``Strategy -> float`` (tokens/s/GPU) or ``Strategy -> result``
with ``tokens_per_s_per_gpu`` and ``valid``. ``"sim"`` (the default) is the discrete-event simulator,
``simcore.engine.simulate(ctx, graph, strategy, engine)`` on the scenario's network; ``"proxy"``
re-evaluates with the proxy itself (the rankings then agree: a cheap switch for tests and sweeps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.megatron import canonical_key, strategy_from_key
from simcore.config import ConfigError
from simcore.cost.lowering import CostContext
from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, simulate
from simcore.strategy.sharding import Strategy

__all__ = ["Reranked", "rerank", "rerank_search", "make_reranker"]


@dataclass
class Reranked:
    """One candidate: proxy value and rank, re-ranker value and rank (1 = best)."""

    strategy: Strategy
    proxy_tokens_per_s_per_gpu: float
    proxy_rank: int
    tokens_per_s_per_gpu: float
    valid: bool
    rank: int = 0


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


def _score(result) -> tuple[float, bool]:
    if isinstance(result, int | float):
        return float(result), True
    return float(result.tokens_per_s_per_gpu), bool(getattr(result, "valid", True))


def rerank(candidates: list[tuple[Strategy, float]], evaluator: Callable[[Strategy], object]) -> list[Reranked]:
    """Re-evaluate ``(strategy, proxy tokens/s/GPU)`` pairs (given best first by the proxy); return
    them best first by the evaluator (valid first, ties kept in proxy order)."""
    out = []
    for i, (strategy, proxy_value) in enumerate(candidates, 1):
        value, valid = _score(evaluator(strategy))
        out.append(Reranked(strategy, float(proxy_value), i, value, valid))
    out.sort(key=lambda r: (not r.valid, -r.tokens_per_s_per_gpu, r.proxy_rank))
    for i, r in enumerate(out, 1):
        r.rank = i
    return out


def rerank_search(ctx: CostContext, result, k: int, evaluator: Callable[[Strategy], object]) -> list[Reranked]:
    """Re-rank a search's ``k`` best distinct plans (elite included; see ``SearchResult.top_valid``)."""
    top = result.top_valid(k, lambda key: canonical_key(key, ctx.model))
    return rerank([(strategy_from_key(key), value) for key, value in top], evaluator)
