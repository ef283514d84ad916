"""Expert placement: which expert (or replica) sits in each slot of each expert-parallel rank.

Every EP rank has ``slots_per_rank(E, ep, N) = ceil((E + N) / ep)`` expert slots; the memory model
counts the same slots (:mod:`simcore.cost.memory`).

- ``redundant = 0``: a static deployment, blind to load: the experts in their index order (which the
  routing law shuffles per layer), in balanced contiguous blocks (``E mod ep`` ranks get one more).
- ``redundant = N > 0``: a load balancer in the manner of DeepSeek's EPLB: replicas go greedily to
  the expert with the highest load per replica (at most one replica of an expert per rank), then
  every replica, heaviest first, goes to the least-loaded rank with a free slot (LPT). An expert's
  tokens split evenly among its replicas. A balancer never makes things worse than not
  replicating, so the number of replicas used is the best of ``0, N/4, N/2, 3N/4, N`` (spare slots
  stay empty).
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ExpertPlacement", "slots_per_rank", "place_experts"]


def slots_per_rank(num_experts: int, ep: int, redundant: int = 0) -> int:
    """Expert slots each of ``ep`` ranks holds for ``num_experts`` experts plus ``redundant`` replicas."""
    return math.ceil((num_experts + redundant) / max(ep, 1))


@dataclass(frozen=True)
class ExpertPlacement:
    """``slot_expert[r, k]``: the expert in slot ``k`` of rank ``r`` (-1: empty); ``slot_share``:
    the fraction of all token copies that slot serves (sums to 1 over the slots)."""

    slot_expert: np.ndarray
    slot_share: np.ndarray

    @property
    def ep(self) -> int:
        return self.slot_expert.shape[0]

    @property
    def rank_share(self) -> np.ndarray:
        return self.slot_share.sum(axis=1)

    @property
    def max_load(self) -> float:
        """Expected load of the busiest rank over the mean (1 = balanced)."""
        return float(self.rank_share.max() * self.ep)

    @property
    def replicas(self) -> np.ndarray:
        """Replica count of every expert."""
        experts = self.slot_expert[self.slot_expert >= 0]
        return np.bincount(experts, minlength=int(experts.max()) + 1)


def place_experts(p: np.ndarray, ep: int, redundant: int = 0) -> ExpertPlacement:
    """Place experts of popularity ``p`` (sums to 1) on ``ep`` ranks with ``redundant`` replicas."""
    p = np.asarray(p, dtype=float)
    if redundant < 0:
        raise ValueError(f"strategy.redundant_experts must be >= 0, got {redundant}")
    if ep < 1 or ep > len(p):
        raise ValueError(f"ep must be in [1, {len(p)}] (the routed experts), got {ep}")
    return _place(p.tobytes(), len(p), int(ep), int(redundant))


@functools.lru_cache(maxsize=4096)
def _place(p_bytes: bytes, num_experts: int, ep: int, redundant: int) -> ExpertPlacement:
    # cached: a layer's popularity, and so its placement, is the same at every decode step
    p = np.frombuffer(p_bytes, dtype=float)
    spr = slots_per_rank(num_experts, ep, redundant)
    if redundant == 0:
        return _static(p, ep, spr)
    best = None
    for used in sorted({0, redundant // 4, redundant // 2, 3 * redundant // 4, redundant}):
        placement = _balanced(p, ep, spr, _replicas(p, ep, used))
        if best is None or placement.max_load < best.max_load - 1e-12:
            best = placement
    return best


def _static(p: np.ndarray, ep: int, spr: int) -> ExpertPlacement:
    expert = np.full((ep, spr), -1, dtype=np.int64)
    for r, block in enumerate(np.array_split(np.arange(len(p)), ep)):
        expert[r, : len(block)] = block
    share = np.where(expert >= 0, p[np.maximum(expert, 0)], 0.0)
    return _frozen(expert, share)


def _replicas(p: np.ndarray, ep: int, extra: int) -> np.ndarray:
    """Replica counts: each extra replica to the expert with the highest load per replica."""
    count = np.ones(len(p), dtype=np.int64)
    heap = [(-w, e) for e, w in enumerate(p.tolist())]
    heapq.heapify(heap)
    for _ in range(extra):
        while heap and count[heap[0][1]] >= ep:  # an expert has at most one replica per rank
            heapq.heappop(heap)
        if not heap:
            break
        _, e = heapq.heappop(heap)
        count[e] += 1
        heapq.heappush(heap, (-p[e] / count[e], e))
    return count


def _balanced(p: np.ndarray, ep: int, spr: int, count: np.ndarray) -> ExpertPlacement:
    """Longest-processing-time packing of the replicas onto ranks of ``spr`` slots."""
    items = sorted(((p[e] / count[e], e) for e in range(len(p)) for _ in range(count[e])), reverse=True)
    expert = np.full((ep, spr), -1, dtype=np.int64)
    share = np.zeros((ep, spr))
    used = np.zeros(ep, dtype=np.int64)
    holds: list[set[int]] = [set() for _ in range(ep)]
    heap = [(0.0, r) for r in range(ep)]
    for w, e in items:
        skipped = []
        while heap:
            load, r = heapq.heappop(heap)
            if e not in holds[r]:
                break
            skipped.append((load, r))
        else:  # every rank with a free slot holds e already: share one of them anyway
            load, r = min(skipped)
            skipped.remove((load, r))
        expert[r, used[r]], share[r, used[r]] = e, w
        used[r] += 1
        holds[r].add(e)
        if used[r] < spr:  # a full rank leaves the heap
            heapq.heappush(heap, (load + w, r))
        for item in skipped:
            heapq.heappush(heap, item)
    return _frozen(expert, share)


def _frozen(expert: np.ndarray, share: np.ndarray) -> ExpertPlacement:
    expert.setflags(write=False)
    share.setflags(write=False)
    return ExpertPlacement(expert, share)
