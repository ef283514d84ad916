"""The action space: one categorical head per strategy component, with switchable divisibility masks.

A proposal is one vector of head indices (the paper's MultiDiscrete action)::

    tp, ep, pp, [dp], [microbatches], batch, one head per operator the model has

``dp`` and ``microbatches`` are optional heads: without a ``dp`` head, ``dp`` is derived so that all
GPUs are used; without a ``microbatches`` head, it is 1. Operator heads pick a code of
:data:`simcore.opgraph.CHOICES`; operators the model lacks (a dense model's router and experts) get no
head, their choice does not change the cost and is fixed to Megatron's.

Masking (Huang & Ontanon, "A closer look at invalid action masking") removes what is cheap to know
invalid before the proxy runs: degree combinations outside the search space (product not dividing the
GPUs, microbatches without a pipeline, batch not divisible by ``ep * microbatches``) and operator
choices that split a dimension ``tp`` does not divide. Masks are conditional: the mask of a head
depends on the values already chosen by the heads before it, so heads are sampled in order. Memory
and SLO limits are never masked; they cost a proxy call and earn the invalid reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.lowering import CostContext, StrategyArrays
from simcore.memory import bit, structural_reasons
from simcore.opgraph import CHOICES, SEARCHABLE_OPS, choice_code, op_applies
from simcore.strategy import megatron_sharding

from .space import SearchSpace

__all__ = ["Head", "ActionSpace", "OUTSIDE_SPACE", "row_reasons"]

OUTSIDE_SPACE = "outside_space"  # reason of a proposal the search space itself rules out
_DEGREE_COLUMN = {"tp": 0, "ep": 1, "pp": 2, "dp": 3, "batch": 4, "microbatches": 5}
_CHOICE_BITS = bit("heads_divisibility") | bit("feature_divisibility")


@dataclass(frozen=True)
class Head:
    """One categorical head: the component it sets and the values it may take (choice codes for
    operators)."""

    name: str
    values: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.values)


class ActionSpace:
    """Heads, masks, and the map between head indices and strategy keys (``Strategy.key()`` rows)."""

    def __init__(self, ctx: CostContext, space: SearchSpace, *, dp_head: bool = False,
                 microbatch_head: bool = True, masking: bool = True) -> None:
        self.space, self.masking = space, masking
        self.num_gpus = space.num_gpus
        grid = space.degree_grid()
        if not microbatch_head:
            grid = grid[grid[:, 5] == 1]
        if len(grid) == 0:
            raise ValueError(f"search space has no degree combination that divides {space.num_gpus} GPUs")
        self.ops = tuple(op for op in SEARCHABLE_OPS if op_applies(ctx.model, op))
        self.fixed = {op: choice_code(c) for op, c in megatron_sharding().items() if op not in self.ops}
        degree_heads = [Head("tp", space.tp), Head("ep", space.ep), Head("pp", space.pp)]
        if dp_head:
            degree_heads.append(Head("dp", tuple(sorted(set(grid[:, 3].tolist())))))
        if microbatch_head:
            degree_heads.append(Head("microbatches", space.microbatches))
        degree_heads.append(Head("batch", space.batch))
        self.degree_heads = tuple(degree_heads)
        self.heads = self.degree_heads + tuple(Head(op, (0, 1, 2)) for op in self.ops)
        self.sizes = np.array([h.size for h in self.heads], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self._grid = {tuple(row) for row in grid.tolist()}
        ok_rows = grid[row_reasons(ctx, grid) == 0]
        self._tries = self._degree_tries(ok_rows)
        self._op_ok = self._op_table(ctx)

    # ----- sizes and names -------------------------------------------------------------------
    @property
    def num_heads(self) -> int:
        return len(self.heads)

    @property
    def total_size(self) -> int:
        return int(self.offsets[-1])

    def head_index(self, name: str) -> int:
        return [h.name for h in self.heads].index(name)

    # ----- masks -------------------------------------------------------------------------------
    def _degree_tries(self, rows: np.ndarray) -> list[dict[tuple, np.ndarray]]:
        """For each degree head: prefix of earlier degree values -> allowed value mask."""
        tries = []
        for i, head in enumerate(self.degree_heads):
            cols = [_DEGREE_COLUMN[h.name] for h in self.degree_heads[: i + 1]]
            trie: dict[tuple, np.ndarray] = {}
            index = {v: j for j, v in enumerate(head.values)}
            for row in rows[:, cols].tolist():
                mask = trie.setdefault(tuple(row[:-1]), np.zeros(head.size, dtype=bool))
                if row[-1] in index:
                    mask[index[row[-1]]] = True
            tries.append(trie)
        return tries

    def _op_table(self, ctx: CostContext) -> dict[int, np.ndarray]:
        """``tp -> bool[num_ops, 3]``: choices that pass the divisibility checks at that ``tp``,
        read from :func:`simcore.memory.structural_reasons` on one-operator strategies."""
        table = {}
        replicated = CHOICES.index("replicated")
        for tp in self.space.tp:
            keys = []
            for op in self.ops:
                for code in range(3):
                    choice = [replicated] * len(SEARCHABLE_OPS)
                    choice[SEARCHABLE_OPS.index(op)] = code
                    keys.append([tp, 1, 1, max(1, self.num_gpus // tp), 1, 1, *choice])
            mask = structural_reasons(ctx, StrategyArrays.from_keys(np.array(keys))) & _CHOICE_BITS
            table[tp] = (mask == 0).reshape(len(self.ops), 3)
        return table

    def head_mask(self, i: int, actions: np.ndarray) -> np.ndarray:
        """``bool[n, size_i]``: allowed values of head ``i`` given columns ``< i`` of ``actions``."""
        n = len(actions)
        head = self.heads[i]
        if not self.masking:
            return np.ones((n, head.size), dtype=bool)
        if i < len(self.degree_heads):
            trie = self._tries[i]
            earlier = self.degree_heads[:i]
            out = np.empty((n, head.size), dtype=bool)
            for r, row in enumerate(np.asarray(actions)[:, :i].tolist()):
                prefix = tuple(h.values[a] for h, a in zip(earlier, row, strict=True))
                mask = trie.get(prefix)
                out[r] = True if mask is None else mask
            return out
        table = self._op_ok
        row = self.ops.index(head.name) if head.name in self.ops else 0
        tp_values = self.heads[0].values
        return np.stack([table[tp_values[a]][row] for a in np.asarray(actions)[:, 0].tolist()])

    def masks(self, actions: np.ndarray) -> np.ndarray:
        """``bool[n, total_size]``: every head's mask given the earlier heads of each action."""
        actions = np.asarray(actions, dtype=np.int64).reshape(-1, self.num_heads)
        return np.concatenate([self.head_mask(i, actions) for i in range(self.num_heads)], axis=1)

    # ----- values, keys, sampling ----------------------------------------------------------------
    def values(self, actions: np.ndarray, upto: int | None = None) -> np.ndarray:
        """Head values (degrees or choice codes) of head indices, for the first ``upto`` heads."""
        upto = self.num_heads if upto is None else upto
        out = np.empty((len(actions), upto), dtype=np.int64)
        for i in range(upto):
            out[:, i] = np.asarray(self.heads[i].values)[actions[:, i]]
        return out

    def to_keys(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Strategy keys ``[n, 18]`` and ``inside[n]``: whether each lies in the search space."""
        actions = np.asarray(actions, dtype=np.int64).reshape(-1, self.num_heads)
        vals = self.values(actions)
        named = {h.name: vals[:, i] for i, h in enumerate(self.heads)}
        n = len(actions)
        tp, ep, pp = named["tp"], named["ep"], named["pp"]
        used = tp * ep * pp
        dp = named.get("dp", np.maximum(self.num_gpus // used, 1))
        mb = named.get("microbatches", np.ones(n, dtype=np.int64))
        keys = np.zeros((n, 6 + len(SEARCHABLE_OPS)), dtype=np.int64)
        keys[:, :6] = np.stack([tp, ep, pp, dp, named["batch"], mb], axis=1)
        for j, op in enumerate(SEARCHABLE_OPS):
            keys[:, 6 + j] = named[op] if op in named else self.fixed[op]
        return keys, self.inside(keys)

    def inside(self, keys: np.ndarray) -> np.ndarray:
        """``bool[n]``: whether each key's degrees are a row of the search space's grid."""
        return np.array([tuple(row) in self._grid for row in np.asarray(keys)[:, :6].tolist()], dtype=bool)

    def from_keys(self, keys: np.ndarray) -> np.ndarray:
        """Head indices of strategy keys (the keys must use values the heads have)."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1, 6 + len(SEARCHABLE_OPS))
        out = np.empty((len(keys), self.num_heads), dtype=np.int64)
        for i, head in enumerate(self.heads):
            col = _DEGREE_COLUMN[head.name] if head.name in _DEGREE_COLUMN else 6 + SEARCHABLE_OPS.index(head.name)
            index = {v: j for j, v in enumerate(head.values)}
            try:
                out[:, i] = [index[int(v)] for v in keys[:, col]]
            except KeyError as exc:
                raise ValueError(f"head {head.name}: value {exc.args[0]} is not one of {head.values}") from None
        return out

    def sample(self, probs: np.ndarray | None, rng: np.random.Generator, n: int = 1,
               with_masks: bool = False):
        """Sample ``n`` actions head by head, renormalizing each head over its mask.

        ``probs`` is ``[n, total_size]`` (per-head probabilities side by side) or ``None`` for
        uniform sampling. One uniform draw per head and action, so a seed fixes the result. With
        ``with_masks`` also return the masks used, as :meth:`masks` would compute them.
        """
        actions = np.zeros((n, self.num_heads), dtype=np.int64)
        used = []
        for i in range(self.num_heads):
            mask = self.head_mask(i, actions)
            used.append(mask)
            lo, hi = self.offsets[i], self.offsets[i + 1]
            p = mask.astype(float) if probs is None else np.where(mask, np.asarray(probs)[:, lo:hi], 0.0)
            empty = p.sum(axis=1) <= 0.0
            if empty.any():  # all mass on masked values: fall back to uniform over the mask
                p[empty] = mask[empty]
            cdf = np.cumsum(p, axis=1)
            u = rng.random(n) * cdf[:, -1]
            actions[:, i] = np.minimum((cdf <= u[:, None]).sum(axis=1), hi - lo - 1)
        return (actions, np.concatenate(used, axis=1)) if with_masks else actions

    def greedy(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Most likely action head by head (each head masked given the greedy earlier heads) and each
        head's top probability after masking, ``[n, H]`` both: the early-exit confidence."""
        probs = np.asarray(probs, dtype=float).reshape(-1, self.total_size)
        n = len(probs)
        actions = np.zeros((n, self.num_heads), dtype=np.int64)
        top = np.zeros((n, self.num_heads))
        for i in range(self.num_heads):
            lo, hi = self.offsets[i], self.offsets[i + 1]
            p = np.where(self.head_mask(i, actions), probs[:, lo:hi], 0.0)
            total = p.sum(axis=1, keepdims=True)
            p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
            actions[:, i] = p.argmax(axis=1)
            top[:, i] = p.max(axis=1)
        return actions, top

    def repair(self, actions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Re-draw (uniformly over the mask) every head whose value its mask forbids, in head order."""
        actions = np.array(actions, dtype=np.int64).reshape(-1, self.num_heads)
        for i in range(self.num_heads):
            mask = self.head_mask(i, actions)
            bad = ~mask[np.arange(len(actions)), actions[:, i]]
            for r in np.flatnonzero(bad):
                allowed = np.flatnonzero(mask[r])
                actions[r, i] = allowed[rng.integers(len(allowed))]
        return actions

    def one_hot(self, actions: np.ndarray) -> np.ndarray:
        """``float[n, total_size]``: the actions one-hot encoded head by head."""
        actions = np.asarray(actions, dtype=np.int64).reshape(-1, self.num_heads)
        out = np.zeros((len(actions), self.total_size))
        rows = np.arange(len(actions))[:, None]
        out[rows, self.offsets[:-1][None, :] + actions] = 1.0
        return out


def row_reasons(ctx: CostContext, rows: np.ndarray) -> np.ndarray:
    """Structural reasons of degree rows alone (every operator replicated, so no choice is at fault)."""
    replicated = CHOICES.index("replicated")
    choices = np.full((len(rows), len(SEARCHABLE_OPS)), replicated, dtype=np.int64)
    return structural_reasons(ctx, StrategyArrays.from_keys(np.concatenate([rows, choices], axis=1)))
