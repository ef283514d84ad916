"""Which per-operator rewrites of a plan trade an all-reduce for all-gathers (or back).

A *rewrite* changes the sharding choice of one operator (or of two operators that only work
together, e.g. shared and routed FFN2 of an MoE layer, whose outputs are summed before one
conversion) and keeps everything else. Whether it is an all-reduce -> all-gather rewrite is read off
the lowered tasks (:func:`simcore.cost.lowering.lower`), not off a hand-written table: among the
collectives whose kind or size changes, the rewritten plan has fewer all-reduces, more all-gathers
and no more of any other kind (``ar->ag``); the reverse (``ag->ar``) is the same with the roles of
the two swapped. The paper's appendix B rewrite (FFN2 sharded on the hidden dimension, ``dim0 ->
dim1``) is found this way: FFN2's all-reduce becomes an all-gather, plus one all-gather of the FFN
activation before FFN2.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import numpy as np

from simcore.cost.lowering import CostContext, StrategyArrays, lower
from simcore.cost.memory import structural_reasons
from simcore.strategy import layout as L
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS, op_applies
from simcore.strategy.sharding import Strategy

__all__ = ["Slot", "Rewrite", "comm_slots", "collective_diff", "classify", "enumerate_rewrites", "phase_of"]

AR, AG = "all_reduce", "all_gather"
_PREFERENCE = {"ar->ag": ("dim1", "dim0", "replicated"), "ag->ar": ("dim0", "dim1", "replicated")}


@dataclass(frozen=True)
class Slot:
    """One communication task of one lowered block: its collective, nccl-tests size (bytes),
    communicator (``tp`` | ``ep`` | ``pp``), idle-fabric time (s) and repeat count."""

    collective: str
    size_bytes: float
    group: str
    time_s: float
    count: int = 1


@dataclass(frozen=True)
class Rewrite:
    """Sharding changes ``((op, new_choice), ...)`` and what they do to the collectives."""

    label: str
    changes: tuple[tuple[str, str], ...]
    direction: str  # "ar->ag" | "ag->ar"
    removed: tuple[str, ...]
    added: tuple[str, ...]

    def apply(self, s: Strategy) -> Strategy:
        return s.replace(sharding=dict(s.sharding) | dict(self.changes))

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for op, _ in self.changes)


def phase_of(ctx: CostContext) -> str:
    """The phase whose tasks decide a rewrite: prefill for prefill workloads, else decode."""
    return "prefill" if ctx.workload.phase == "prefill" else "decode"


def comm_slots(ctx: CostContext, strategies: list[Strategy], phase: str,
               context_len=None) -> list[dict[tuple[str, str], Slot]]:
    """Per strategy, ``(block, task name) -> Slot`` of every collective that moves bytes."""
    n = len(strategies)
    blocks = lower(ctx, StrategyArrays.from_strategies(strategies), phase, context_len)
    out: list[dict[tuple[str, str], Slot]] = [{} for _ in range(n)]
    for block, tasks in blocks.items():
        for task in tasks:
            if not task.is_comm:
                continue
            codes = np.broadcast_to(np.asarray(task.extra.get("collective", 0)), (n,))
            sizes = np.broadcast_to(np.asarray(task.size_bytes, dtype=float), (n,))
            times = np.broadcast_to(np.asarray(task.time_s, dtype=float), (n,))
            for i in np.flatnonzero(codes != L.NONE):
                key = (block, task.name)
                if key in out[i]:
                    raise ValueError(f"lowering: task {task.name!r} appears twice in block {block!r}")
                out[i][key] = Slot(L.COLLECTIVE_NAMES[int(codes[i])], float(sizes[i]), task.group,
                                   float(times[i]), task.count)
    return out


def collective_diff(base: dict, variant: dict) -> list[tuple[tuple[str, str], Slot | None, Slot | None]]:
    """The slots whose collective or size differ: ``(key, base slot, variant slot)``."""
    out = []
    for key in sorted(set(base) | set(variant)):
        b, v = base.get(key), variant.get(key)
        if (b and (b.collective, b.size_bytes)) != (v and (v.collective, v.size_bytes)):
            out.append((key, b, v))
    return out


def classify(diff) -> str | None:
    """``ar->ag``, ``ag->ar`` or ``None`` for a collective diff (see the module docstring)."""
    before = Counter(b.collective for _, b, _ in diff if b)
    after = Counter(v.collective for _, _, v in diff if v)

    def only_grows(kind: str) -> bool:
        return all(after[k] <= before[k] for k in after if k != kind)

    if after[AR] < before[AR] and after[AG] > before[AG] and only_grows(AG):
        return "ar->ag"
    if after[AR] > before[AR] and after[AG] < before[AG] and only_grows(AR):
        return "ag->ar"
    return None


def _describe(slot: Slot, key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}: {slot.collective} {slot.size_bytes / 2**20:.3g} MiB ({slot.group})"


def _rewrite(base: Strategy, changes, direction: str, diff) -> Rewrite:
    parts = [f"{op} {base.sharding[op]}->{choice}" for op, choice in changes]
    removed = tuple(_describe(b, k) for k, b, _ in diff if b)
    added = tuple(_describe(v, k) for k, _, v in diff if v)
    return Rewrite(" + ".join(parts), tuple(changes), direction, removed, added)


def _candidates(base: Strategy, ops: list[str]) -> list[tuple[tuple[str, str], ...]]:
    singles = [((op, c),) for op in ops for c in CHOICES if c != base.sharding[op]]
    pairs = [((a, ca), (b, cb)) for a, b in itertools.combinations(ops, 2)
             for ca in CHOICES for cb in CHOICES if ca != base.sharding[a] and cb != base.sharding[b]]
    return singles + pairs


def enumerate_rewrites(ctx: CostContext, base: Strategy, phase: str | None = None) -> list[Rewrite]:
    """Every minimal all-reduce <-> all-gather rewrite of ``base`` (empty when ``tp == 1``).

    Singles first: per operator, the first qualifying choice in the order of ``_PREFERENCE`` (hidden
    dimension first for ``ar->ag``). Pairs only where neither of their two changes qualifies alone,
    one per operator pair. Last, ``all``: every ``ar->ag`` single and pair without replication, on
    disjoint operators, at once (the paper's whole pattern), when that is more than one change and
    still qualifies.
    """
    if base.tp == 1:
        return []
    phase = phase or phase_of(ctx)
    ops = [op for op in SEARCHABLE_OPS if op_applies(ctx.model, op)]
    cands = _candidates(base, ops)
    variants = [base.replace(sharding=dict(base.sharding) | dict(c)) for c in cands]
    structural = structural_reasons(ctx, StrategyArrays.from_strategies(variants))
    slots = comm_slots(ctx, [base, *variants], phase)
    found: dict[tuple[str, ...], list[tuple[str, tuple, list]]] = {}
    for change, variant_slots, bad in zip(cands, slots[1:], structural, strict=True):
        direction = None if bad else classify(diff := collective_diff(slots[0], variant_slots))
        if direction is not None:
            found.setdefault(tuple(op for op, _ in change), []).append((direction, change, diff))
    singles = {o[1][0] for key, options in found.items() if len(key) == 1 for o in options}
    rewrites = []
    for options in found.values():
        options = [o for o in options if len(o[1]) == 1 or not set(o[1]) & singles]  # minimal only
        if not options:
            continue
        direction, change, diff = min(options, key=lambda o: [_PREFERENCE[o[0]].index(c) for _, c in o[1]])
        rewrites.append(_rewrite(base, change, direction, diff))
    combined = _combined(ctx, base, rewrites, phase, slots[0])
    return rewrites + ([combined] if combined else [])


def _combined(ctx: CostContext, base: Strategy, rewrites: list[Rewrite], phase: str, base_slots) -> Rewrite | None:
    changes: dict[str, str] = {}
    for rw in rewrites:  # the paper's pattern: hidden- or feature-dimension sharding, never replication
        hidden = all(choice != "replicated" for _, choice in rw.changes)
        if rw.direction == "ar->ag" and hidden and not set(rw.ops) & set(changes):
            changes.update(dict(rw.changes))
    if len(changes) < 2:
        return None
    variant = base.replace(sharding=dict(base.sharding) | changes)
    if structural_reasons(ctx, StrategyArrays.from_strategies([variant]))[0]:
        return None
    diff = collective_diff(base_slots, comm_slots(ctx, [variant], phase)[0])
    if classify(diff) != "ar->ag":
        return None
    rw = _rewrite(base, tuple(changes.items()), "ar->ag", diff)
    return Rewrite("all: " + rw.label, rw.changes, rw.direction, rw.removed, rw.added)
