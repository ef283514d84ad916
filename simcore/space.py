"""The coarse search space: which degrees, batch sizes and microbatch counts a planner may pick.

Every planner (the Megatron heuristic, the exact optimum, PPO and the metaheuristics) draws from
one :class:`SearchSpace`, so their answers are comparable. It lives in ``simcore`` because
``shard-sim`` searches it too (for the Megatron plan it simulates when given none).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .lowering import CostContext, StrategyArrays
from .opgraph import SEARCHABLE_OPS, choice_code
from .strategy import megatron_sharding

__all__ = ["SearchSpace", "powers_of_two"]


def powers_of_two(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit`` inclusive."""
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return tuple(out)


@dataclass(frozen=True)
class SearchSpace:
    """Allowed values of each coarse knob; ``dp`` is derived so that all GPUs are used."""

    num_gpus: int
    tp: tuple[int, ...]
    ep: tuple[int, ...]
    pp: tuple[int, ...]
    batch: tuple[int, ...]
    microbatches: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        for name in ("tp", "ep", "pp", "batch", "microbatches"):
            values = getattr(self, name)
            if not values or any(int(v) < 1 for v in values):
                raise ValueError(f"search space {name}: needs positive values, got {values!r}")

    @classmethod
    def for_context(cls, ctx: CostContext, batch: tuple[int, ...] | None = None,
                    microbatches: tuple[int, ...] = (1, 2, 4, 8), max_tp: int | None = None,
                    max_pp: int = 16) -> SearchSpace:
        """The default space: powers of two up to the cluster (tp capped at one node's width by
        default, as TP across nodes is never competitive), ep over the expert count, pp <= 16."""
        n, m = ctx.cluster.num_gpus, ctx.model
        tp_cap = max_tp or min(n, max(ctx.cluster.nvlink_domain_size, 8))
        tp = tuple(v for v in powers_of_two(tp_cap) if v <= n)
        ep = tuple(v for v in powers_of_two(min(n, m.num_experts)) if m.num_experts % v == 0) if m.is_moe else (1,)
        pp = tuple(v for v in powers_of_two(min(n, max_pp, m.num_layers)))
        batch = batch or powers_of_two(4096)
        return cls(n, tp, ep, pp, tuple(batch), tuple(microbatches))

    def degree_grid(self) -> np.ndarray:
        """Every (tp, ep, pp, dp, batch, microbatches) whose product of degrees divides the GPUs."""
        rows = []
        for tp, ep, pp, b, mb in itertools.product(self.tp, self.ep, self.pp, self.batch, self.microbatches):
            used = tp * ep * pp
            if self.num_gpus % used or mb > b or (mb > 1 and pp == 1):
                continue
            rows.append((tp, ep, pp, self.num_gpus // used, b, mb))
        return np.array(rows, dtype=np.int64).reshape(-1, 6)

    def with_sharding(self, degrees: np.ndarray, sharding: dict[str, str] | None = None) -> StrategyArrays:
        """Strategies from degree rows and one fixed per-operator sharding (Megatron's by default)."""
        sharding = sharding or megatron_sharding()
        codes = np.array([choice_code(sharding[op]) for op in SEARCHABLE_OPS], dtype=np.int64)
        keys = np.concatenate([degrees, np.broadcast_to(codes, (len(degrees), len(codes)))], axis=1)
        return StrategyArrays.from_keys(keys)
