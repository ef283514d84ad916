"""The action space: one categorical head per strategy component, with switchable divisibility masks.

A proposal is one vector of head indices (the paper's MultiDiscrete action)::

    tp, ep, pp, [dp], [microbatches], batch, [redundant_experts], one head per operator the model has

``dp`` and ``microbatches`` are optional heads: without a ``dp`` head, ``dp`` is derived so that all
GPUs are used; without a ``microbatches`` head, it is 1. The ``redundant_experts`` head exists when
the space offers replicas (``SearchSpace.redundant_per_rank``, only for MoE models under skewed
routing): its values are replicas per EP rank, so the key's ``redundant_experts`` is ``value * ep``.
Without it keys have no redundant-experts column (:data:`planner.megatron.BASE_WIDTH` columns) and a
search is exactly what it was before the head existed. Operator heads pick a code of
:data:`simcore.strategy.opgraph.CHOICES`; operators the model lacks (a dense model's router and experts) get no
head, their choice does not change the cost and is fixed to Megatron's.

Masking (Huang & Ontanon, "A closer look at invalid action masking") removes what is cheap to know
invalid before the proxy runs: degree combinations outside the search space (product not dividing the
GPUs, microbatches without a pipeline, batch not divisible by ``ep * microbatches``) and operator
choices that split a dimension ``tp`` does not divide, and redundant experts at ``ep = 1``, beyond
``E * (ep - 1)`` or that overflow HBM even under the leanest sharding of their degree row (every
weight split ``tp`` ways: a lower bound of every plan of that row, so no plan that fits is masked).
Masks are conditional: the mask of a head depends on the values already chosen by the heads before
it, so heads are sampled in order. Other memory and SLO limits are never masked; they cost a proxy
call and earn the invalid reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.megatron import BASE_WIDTH, KEY_WIDTH, full_keys
from planner.space import SearchSpace
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import bit, memory_per_gpu_bytes, structural_reasons
from simcore.strategy.opgraph import CHOICES, DIM0, DIM1, SEARCHABLE_OPS, choice_code, op_applies
from simcore.strategy.sharding import megatron_sharding

__all__ = ["Head", "ActionSpace", "OUTSIDE_SPACE", "REDUNDANT", "row_reasons", "redundant_fits"]

OUTSIDE_SPACE = "outside_space"  # reason of a proposal the search space itself rules out
REDUNDANT = "redundant_experts"  # the head of redundant expert replicas (values: replicas per EP rank)
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
    """Heads, masks, and the map between head indices and strategy keys (``Strategy.key()`` rows,
    :attr:`key_width` columns: without the redundant-experts column when there is no such head)."""

    redundant_index: int | None = None  # index of the redundant-experts head (None: no such head)
    key_width: int = BASE_WIDTH

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
        coarse = self.degree_heads
        if len(space.redundant_per_rank) > 1 and max(space.ep) > 1:
            self.redundant_index = len(coarse)
            self.key_width = KEY_WIDTH
            coarse = coarse + (Head(REDUNDANT, tuple(int(v) for v in space.redundant_per_rank)),)
        self.coarse_heads = coarse
        self.heads = coarse + tuple(Head(op, (0, 1, 2)) for op in self.ops)
        self.sizes = np.array([h.size for h in self.heads], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self._grid = {tuple(row) for row in grid.tolist()}
        ok_rows = grid[row_reasons(ctx, grid) == 0]
        self._tries = self._degree_tries(ok_rows)
        self._op_ok = self._op_table(ctx)
        self._redundant_ok = self._redundant_table(ctx, ok_rows) if self.redundant_index is not None else {}

    # ----- sizes and names -------------------------------------------------------------------
    @property
    def num_heads(self) -> int:
        return len(self.heads)

    @property
    def total_size(self) -> int:
        return int(self.offsets[-1])

    def head_index(self, name: str) -> int:
        return [h.name for h in self.heads].index(name)

    @property
    def num_coarse(self) -> int:
        """Heads before the operator heads: the degrees, batch, microbatches and redundant experts."""
        return len(getattr(self, "coarse_heads", self.degree_heads))

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
        read from :func:`simcore.cost.memory.structural_reasons` on one-operator strategies."""
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

    def _redundant_table(self, ctx: CostContext, rows: np.ndarray) -> dict[tuple, np.ndarray]:
        """Degree row -> allowed values of the redundant-experts head (:func:`redundant_fits`)."""
        ext = self.space.with_redundant(rows)
        ok = redundant_fits(ctx, ext) | (ext[:, 6] == 0)
        k = len(self.space.redundant_per_rank)
        return {tuple(row): mask for row, mask in zip(rows.tolist(), ok.reshape(len(rows), k), strict=True)}

    def head_mask(self, i: int, actions: np.ndarray) -> np.ndarray:
        """``bool[n, size_i]``: allowed values of head ``i`` given columns ``< i`` of ``actions``."""
        n = len(actions)
        head = self.heads[i]
        if not self.masking:
            return np.ones((n, head.size), dtype=bool)
        if i == self.redundant_index:
            return self._redundant_mask(actions)
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

    def _redundant_mask(self, actions: np.ndarray) -> np.ndarray:
        """Allowed replicas per rank given the degree heads; only 0 on a row outside the space."""
        head = self.heads[self.redundant_index]
        none = np.arange(head.size) == head.values.index(0)
        actions = np.asarray(actions, dtype=np.int64)
        rows = self._degree_rows(actions) if len(actions) else np.zeros((0, 6), dtype=np.int64)
        return np.stack([self._redundant_ok.get(tuple(r), none) for r in rows.tolist()]) if len(rows) \
            else np.zeros((0, head.size), dtype=bool)

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

    def _degree_rows(self, actions: np.ndarray) -> np.ndarray:
        """``[n, 6]`` degree rows (tp, ep, pp, dp, batch, microbatches) of the degree heads' values."""
        k = len(self.degree_heads)
        vals = self.values(np.asarray(actions, dtype=np.int64)[:, :k], upto=k)
        named = {h.name: vals[:, i] for i, h in enumerate(self.degree_heads)}
        tp, ep, pp = named["tp"], named["ep"], named["pp"]
        dp = named.get("dp", np.maximum(self.num_gpus // (tp * ep * pp), 1))
        mb = named.get("microbatches", np.ones(len(vals), dtype=np.int64))
        return np.stack([tp, ep, pp, dp, named["batch"], mb], axis=1)

    def to_keys(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Strategy keys ``[n, key_width]`` and ``inside[n]``: whether each lies in the search space."""
        actions = np.asarray(actions, dtype=np.int64).reshape(-1, self.num_heads)
        vals = self.values(actions)
        named = {h.name: vals[:, i] for i, h in enumerate(self.heads)}
        n = len(actions)
        keys = np.zeros((n, self.key_width), dtype=np.int64)
        keys[:, :6] = self._degree_rows(actions)
        for j, op in enumerate(SEARCHABLE_OPS):
            keys[:, 6 + j] = named[op] if op in named else self.fixed[op]
        if self.redundant_index is not None:
            keys[:, BASE_WIDTH] = named[REDUNDANT] * keys[:, 1]
        return keys, self.inside(keys)

    def inside(self, keys: np.ndarray) -> np.ndarray:
        """``bool[n]``: whether each key's degrees are a row of the search space's grid and its
        redundant experts (0 when the key has no such column) one of the space's options at its ``ep``."""
        keys = full_keys(keys)
        head = self.redundant_index is not None
        return np.array([tuple(row[:6]) in self._grid
                         and row[BASE_WIDTH] in (self.space.redundant_options(row[1]) if head else (0,))
                         for row in keys.tolist()], dtype=bool)

    def fit_keys(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys of either width in this space's :attr:`key_width`, and :meth:`inside` of each (a key
        with replicas in a space without the head is outside; its column is dropped)."""
        keys = full_keys(keys)
        return keys[:, : self.key_width], self.inside(keys)

    def from_keys(self, keys: np.ndarray) -> np.ndarray:
        """Head indices of strategy keys of either width (the keys must use values the heads have)."""
        keys = full_keys(keys)
        out = np.empty((len(keys), self.num_heads), dtype=np.int64)
        for i, head in enumerate(self.heads):
            if head.name == REDUNDANT:
                ep = np.maximum(keys[:, 1], 1)
                column = np.where(keys[:, BASE_WIDTH] % ep == 0, keys[:, BASE_WIDTH] // ep, -1)
            else:
                col = _DEGREE_COLUMN[head.name] if head.name in _DEGREE_COLUMN else 6 + SEARCHABLE_OPS.index(head.name)
                column = keys[:, col]
            index = {v: j for j, v in enumerate(head.values)}
            try:
                out[:, i] = [index[int(v)] for v in column]
            except KeyError as exc:
                raise ValueError(f"head {head.name}: value {exc.args[0]} is not one of {head.values}") from None
        if self.redundant_index is None and len(keys) and keys[:, BASE_WIDTH].any():
            raise ValueError(f"redundant experts {sorted(set(keys[:, BASE_WIDTH].tolist()) - {0})}: this space has "
                             f"no redundant-experts head")
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
    """Structural reasons of degree rows alone (every operator replicated, so no choice is at fault);
    rows of 6 degrees, or 7 columns with the redundant experts last."""
    rows = np.asarray(rows, dtype=np.int64)
    replicated = CHOICES.index("replicated")
    choices = np.full((len(rows), len(SEARCHABLE_OPS)), replicated, dtype=np.int64)
    return structural_reasons(ctx, StrategyArrays.from_keys(np.concatenate([rows[:, :6], choices, rows[:, 6:]],
                                                                           axis=1)))


def redundant_fits(ctx: CostContext, rows: np.ndarray) -> np.ndarray:
    """``bool[n]`` of rows ``(tp, ep, pp, dp, batch, microbatches, redundant)``: the replicas have
    ranks to sit on (``ep > 1``, at most ``E * (ep - 1)``) and some plan of the row may fit HBM with
    them. Memory is lowest with every weight split ``tp`` ways and attention split by sequences or
    by heads, whichever holds less KV cache; above usable HBM there, every plan of the row is."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, 7)
    n = len(rows)
    ok = (row_reasons(ctx, rows) & bit("redundant_experts")) == 0
    lean = np.full(n, np.inf)
    for attention in (DIM0, DIM1):
        choices = np.full((n, len(SEARCHABLE_OPS)), DIM0, dtype=np.int64)
        choices[:, SEARCHABLE_OPS.index("attention")] = attention
        keys = np.concatenate([rows[:, :6], choices, rows[:, 6:]], axis=1)
        lean = np.minimum(lean, memory_per_gpu_bytes(ctx, StrategyArrays.from_keys(keys)))
    return ok & (lean <= ctx.cluster.gpu.usable_hbm_bytes)
