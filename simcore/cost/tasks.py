"""What the lowering takes and gives: strategies as arrays, the cost context, and tasks.

:class:`StrategyArrays` holds many strategies as parallel int arrays (degrees plus one sharding-choice
code per operator), so :mod:`simcore.cost.lowering` prices them all in one vectorized pass;
:class:`CostContext` is everything a cost depends on besides the strategy; a :class:`Task` is one
kernel or one collective of one microbatch with one time per strategy, as the proxy sums them and the
simulator schedules them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simcore.cost.cluster import Cluster
from simcore.models import ModelSpec
from simcore.strategy.opgraph import SEARCHABLE_OPS
from simcore.strategy.sharding import Strategy
from simcore.workload import Workload

__all__ = ["StrategyArrays", "Task", "CostContext"]


@dataclass
class StrategyArrays:
    """Strategies as parallel int arrays: degrees plus one choice-code array per operator."""

    tp: np.ndarray
    ep: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    batch: np.ndarray
    microbatches: np.ndarray
    choice: dict[str, np.ndarray]
    redundant: np.ndarray | None = None  # redundant expert replicas (None: 0 for every strategy)

    def __post_init__(self) -> None:
        if self.redundant is None:
            self.redundant = np.zeros(len(self.tp), dtype=np.int64)

    @classmethod
    def from_strategies(cls, strategies: list[Strategy]) -> StrategyArrays:
        keys = np.array([s.key() for s in strategies], dtype=np.int64).reshape(len(strategies), -1)
        return cls.from_keys(keys)

    @classmethod
    def from_keys(cls, keys: np.ndarray) -> StrategyArrays:
        """From rows of :meth:`Strategy.key` (6 degrees, one code per operator, then the redundant
        experts; rows without that last column mean none)."""
        keys = np.asarray(keys, dtype=np.int64)
        cols = [keys[:, i] for i in range(6)]
        choice = {op: keys[:, 6 + i] for i, op in enumerate(SEARCHABLE_OPS)}
        n = 6 + len(SEARCHABLE_OPS)
        redundant = keys[:, n] if keys.shape[1] > n else None
        return cls(*cols, choice=choice, redundant=redundant)

    def __len__(self) -> int:
        return len(self.tp)


@dataclass
class Task:
    """One kernel or one collective of one microbatch, priced for every strategy.

    ``group`` is ``""`` for compute, else the communicator: ``tp`` (stride 1), ``ep`` (stride tp),
    ``pp`` (a send/recv to the next stage). ``count`` repeats the task (e.g. two norms per layer).
    """

    name: str
    op: str
    kind: str
    time_s: np.ndarray
    group: str = ""
    size_bytes: np.ndarray | float = 0.0
    flops: np.ndarray | float = 0.0
    count: int = 1
    branch: str = ""  # "" = the main chain; "shared" = shared experts, which may overlap routed ones
    extra: dict = field(default_factory=dict)

    @property
    def is_comm(self) -> bool:
        return self.group != ""


@dataclass(frozen=True)
class CostContext:
    """Everything a cost depends on besides the strategy."""

    model: ModelSpec
    workload: Workload
    cluster: Cluster
    collective_constants: object | None = None  # NcclConstants override; None = calibrated defaults
    # simcore.moe.RoutingConfig: the proxy prices the expected busiest expert rank under it and
    # dispatch/combine by its ``a2a`` algorithm; None = uniform routing, NCCL all-to-all
    routing: object | None = None
