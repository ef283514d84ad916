"""The Megatron heuristic: Megatron's per-operator sharding held fixed, exhaustive over the degrees
(tp, ep, pp, dp), batch and microbatches of a :class:`~simcore.space.bounds.SearchSpace` under the proxy.

A strong baseline (any gain over it must come from per-operator sharding choices, the paper's
Figure 3) and the plan ``shard-sim`` simulates when it is given none. The planners import it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.cost.lowering import CostContext
from simcore.cost.proxy import BatchResult, evaluate_batch
from simcore.space.bounds import SearchSpace
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS
from simcore.strategy.sharding import Strategy

__all__ = ["RankedPlans", "megatron_search", "rank", "strategy_from_key"]


@dataclass
class RankedPlans:
    """Evaluated strategies, best first (valid before invalid, then by tokens/s/GPU)."""

    keys: np.ndarray        # [n, 18] strategy keys
    result: BatchResult
    order: np.ndarray       # indices into keys, best first
    calls: int

    def strategy(self, rank_index: int = 0) -> Strategy:
        return strategy_from_key(self.keys[self.order[rank_index]])

    @property
    def num_valid(self) -> int:
        return int(self.result.valid.sum())


def strategy_from_key(key) -> Strategy:
    """The strategy of a key row: 6 degrees, one choice code per operator (then optional extras)."""
    key = [int(v) for v in key]
    tp, ep, pp, dp, batch, mb = key[:6]
    n = 6 + len(SEARCHABLE_OPS)
    sharding = {op: CHOICES[c] for op, c in zip(SEARCHABLE_OPS, key[6:n], strict=True)}
    redundant = key[n] if len(key) > n else 0  # Strategy.key's last column (0 when absent)
    return Strategy(tp=tp, ep=ep, pp=pp, dp=dp, batch=batch, microbatches=mb, sharding=sharding,
                    redundant_experts=redundant)


def rank(result: BatchResult) -> np.ndarray:
    """Best first: valid strategies by descending tokens/s/GPU, then invalid ones."""
    score = np.where(result.valid, result.tokens_per_s_per_gpu, -np.inf)
    return np.lexsort((-np.nan_to_num(result.tokens_per_s_per_gpu), -score))


def megatron_search(ctx: CostContext, space: SearchSpace | None = None) -> RankedPlans:
    """Evaluate every degree combination of ``space`` with Megatron sharding, in one batch call."""
    space = space or SearchSpace.for_context(ctx)
    degrees = space.degree_grid()
    if len(degrees) == 0:
        raise ValueError(f"search space has no degree combination that divides {space.num_gpus} GPUs")
    arrays = space.with_sharding(degrees)
    result = evaluate_batch(ctx, arrays)
    keys = np.concatenate([degrees, np.stack([arrays.choice[op] for op in arrays.choice], axis=1)], axis=1)
    return RankedPlans(keys, result, rank(result), calls=len(degrees))
