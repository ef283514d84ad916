"""The Megatron heuristic baseline: Megatron's per-operator sharding held fixed, exhaustive over the
degrees (tp, ep, pp, dp), batch and microbatches under the proxy. A strong baseline: any gain over
it must come from per-operator sharding choices (the paper's Figure 3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.lowering import CostContext
from simcore.proxy import BatchResult, evaluate_batch
from simcore.strategy import Strategy

from .space import SearchSpace

__all__ = ["RankedPlans", "megatron_search", "rank", "strategy_from_key", "canonical_key"]


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
    from simcore.opgraph import CHOICES, SEARCHABLE_OPS

    key = [int(v) for v in key]
    tp, ep, pp, dp, batch, mb = key[:6]
    sharding = {op: CHOICES[c] for op, c in zip(SEARCHABLE_OPS, key[6:], strict=True)}
    return Strategy(tp=tp, ep=ep, pp=pp, dp=dp, batch=batch, microbatches=mb, sharding=sharding)


def canonical_key(key, model) -> tuple[int, ...]:
    """``key`` with every choice that cannot change the cost set to Megatron's: all of them when
    tp = 1 (nothing is split) and those of operators the model does not have. Two strategies with
    the same canonical key are the same plan, so re-ranking both would waste a simulation."""
    from simcore.opgraph import CHOICES, SEARCHABLE_OPS, op_applies
    from simcore.strategy import megatron_sharding

    key = tuple(int(v) for v in key)
    meg = megatron_sharding()
    choices = [CHOICES.index(meg[op]) if key[0] == 1 or not op_applies(model, op) else c
               for op, c in zip(SEARCHABLE_OPS, key[6:], strict=True)]
    return key[:6] + tuple(choices)


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
