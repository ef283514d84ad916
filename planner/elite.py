"""The elite history: the top ``T`` distinct valid strategies seen, the policy's observation.

Each record is the strategy's head indices one-hot encoded head by head, followed by its throughput
normalized by the evaluator's reference and a presence flag (empty slots are all zeros), so the
observation is ``X in R^{T x A}`` with ``A = sum(head sizes) + 2``. Records are sorted best first;
a valid strategy that beats the worst elite replaces it (the paper's deque, sorted by throughput
rather than by ``|r|``, since ``r`` depends on the best-so-far when it was earned).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.actions import ActionSpace

__all__ = ["Elite"]


@dataclass
class Elite:
    """Up to ``size`` records ``(normalized throughput, action tuple)``, best first. With
    ``distinct_prefix = n > 0`` no two records share their first ``n`` heads (the degree heads): the
    history then shows ``T`` different layouts of the cluster rather than variants of one."""

    size: int
    records: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    distinct_prefix: int = 0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"elite size (T) must be >= 1, got {self.size}")

    def offer(self, value: float, action) -> bool:
        """Insert a valid strategy if it is new and beats the worst elite; return whether it entered."""
        action = tuple(int(a) for a in action)
        if any(a == action for _, a in self.records):
            return False
        n = self.distinct_prefix
        if n:  # a diverse elite: one record per value of the first n heads (the coarse degrees)
            same = [i for i, (_, a) in enumerate(self.records) if a[:n] == action[:n]]
            if same and value <= self.records[same[0]][0]:
                return False
            for i in reversed(same):
                del self.records[i]
        if len(self.records) >= self.size and value <= self.records[-1][0]:
            return False
        self.records.append((float(value), action))
        self.records.sort(key=lambda r: -r[0])  # stable: earlier entries win ties
        del self.records[self.size:]
        return True

    @property
    def best(self) -> tuple[float, tuple[int, ...]] | None:
        return self.records[0] if self.records else None

    @staticmethod
    def record_dim(actions: ActionSpace) -> int:
        return actions.total_size + 2

    def observation(self, actions: ActionSpace) -> np.ndarray:
        """``float32[T, A]``: one record per slot, best first, zeros for empty slots."""
        obs = np.zeros((self.size, self.record_dim(actions)), dtype=np.float32)
        if self.records:
            acts = np.array([a for _, a in self.records], dtype=np.int64)
            n = len(acts)
            obs[:n, : actions.total_size] = actions.one_hot(acts)
            obs[:n, -2] = [v for v, _ in self.records]
            obs[:n, -1] = 1.0
        return obs
