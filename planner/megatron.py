"""The Megatron heuristic baseline (defined in :mod:`simcore.megatron`, which ``shard-sim`` uses too) and
:func:`canonical_key`, the planners' identity of a plan for de-duplicating re-ranking."""

from __future__ import annotations

from simcore.megatron import RankedPlans, megatron_search, rank, strategy_from_key

__all__ = ["RankedPlans", "megatron_search", "rank", "strategy_from_key", "canonical_key"]


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
