"""The Megatron heuristic baseline (defined in :mod:`simcore.space.megatron`, which ``shard-sim`` uses too),
:func:`canonical_key`, the planners' identity of a plan for de-duplicating re-ranking, and the width of
a strategy key.

A key is a row of :meth:`simcore.strategy.sharding.Strategy.key`: 6 degrees, one choice code per operator, then
``redundant_experts`` (:data:`KEY_WIDTH` columns). Rows without that last column mean 0 replicas;
:func:`full_keys` adds it."""

from __future__ import annotations

import numpy as np

from simcore.space.megatron import RankedPlans, megatron_search, rank, strategy_from_key
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS, op_applies
from simcore.strategy.sharding import megatron_sharding

__all__ = ["RankedPlans", "megatron_search", "rank", "strategy_from_key", "canonical_key", "KEY_WIDTH",
           "BASE_WIDTH", "full_keys"]

BASE_WIDTH = 6 + len(SEARCHABLE_OPS)  # degrees and choices: a key without the redundant-experts column
KEY_WIDTH = BASE_WIDTH + 1            # Strategy.key(): ... then redundant_experts


def full_keys(keys) -> np.ndarray:
    """Key rows ``[n, KEY_WIDTH]``; rows of :data:`BASE_WIDTH` columns get 0 redundant experts."""
    keys = np.asarray(keys, dtype=np.int64)
    if keys.ndim != 2:
        keys = keys.reshape(1, -1) if keys.ndim == 1 else keys.reshape(-1, keys.shape[-1])
    if keys.shape[1] == BASE_WIDTH:
        return np.concatenate([keys, np.zeros((len(keys), 1), dtype=np.int64)], axis=1)
    if keys.shape[1] != KEY_WIDTH:
        raise ValueError(f"a strategy key has {BASE_WIDTH} or {KEY_WIDTH} columns, got {keys.shape[1]}")
    return keys


def canonical_key(key, model) -> tuple[int, ...]:
    """``key`` with every choice that cannot change the cost set to Megatron's: all of them when
    tp = 1 (nothing is split) and those of operators the model does not have. Two strategies with
    the same canonical key are the same plan, so re-ranking both would waste a simulation. Keys with
    or without the redundant-experts column are accepted; the answer always has it (:data:`KEY_WIDTH`)."""

    key = tuple(int(v) for v in key)
    if len(key) not in (BASE_WIDTH, KEY_WIDTH):
        raise ValueError(f"a strategy key has {BASE_WIDTH} or {KEY_WIDTH} columns, got {len(key)}")
    meg = megatron_sharding()
    choices = [CHOICES.index(meg[op]) if key[0] == 1 or not op_applies(model, op) else c
               for op, c in zip(SEARCHABLE_OPS, key[6:BASE_WIDTH], strict=True)]
    redundant = key[BASE_WIDTH] if len(key) > BASE_WIDTH else 0
    return key[:6] + tuple(choices) + (redundant,)
