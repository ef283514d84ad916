"""The coarse search space: which degrees, batch sizes, microbatch counts and redundant experts a
planner may pick.

Every planner (the Megatron heuristic, the exact optimum, PPO and the metaheuristics) draws from
one :class:`SearchSpace`, so their answers are comparable. It lives in ``simcore`` because
``shard-sim`` searches it too (for the Megatron plan it simulates when given none).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.strategy.opgraph import SEARCHABLE_OPS, choice_code
from simcore.strategy.sharding import megatron_sharding

__all__ = ["SearchSpace", "powers_of_two", "replicas_can_help"]


def powers_of_two(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit`` inclusive."""
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return tuple(out)


def replicas_can_help(ctx: CostContext, ep: tuple[int, ...]) -> bool:
    """Whether redundant experts can lower the proxy's cost at some ``ep`` of a space: only an MoE
    model with ``ep > 1`` under a routing config the proxy prices as unbalanced. Without one (the
    proxy's uniform routing), or under expected uniform routing with ``ep`` dividing the experts,
    every rank already carries exactly its share; replicas then only add expert slots (memory, and
    weights read by the grouped GEMM), so no plan with them can beat the same plan without."""
    m, routing = ctx.model, ctx.routing
    ep = [int(e) for e in ep if int(e) > 1]
    if not m.is_moe or not ep or routing is None:
        return False
    return not routing.is_uniform or any(m.num_experts % e for e in ep)


@dataclass(frozen=True)
class SearchSpace:
    """Allowed values of each coarse knob; ``dp`` is derived so that all GPUs are used.

    ``redundant_per_rank``: redundant expert replicas per EP rank a plan may add, so
    ``strategy.redundant_experts = value * ep`` (every rank gets ``value`` extra expert slots; ``(0,)``:
    none, the default). It must hold 0 (the Megatron heuristic and the warm start use no replicas).
    """

    num_gpus: int
    tp: tuple[int, ...]
    ep: tuple[int, ...]
    pp: tuple[int, ...]
    batch: tuple[int, ...]
    microbatches: tuple[int, ...] = (1,)
    redundant_per_rank: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        for name in ("tp", "ep", "pp", "batch", "microbatches"):
            values = getattr(self, name)
            if not values or any(int(v) < 1 for v in values):
                raise ValueError(f"search space {name}: needs positive values, got {values!r}")
        values = self.redundant_per_rank
        if 0 not in values or any(int(v) < 0 for v in values) or len(set(values)) != len(values):
            raise ValueError(f"search space redundant_per_rank: needs distinct values >= 0 including 0, got {values!r}")
        object.__setattr__(self, "redundant_per_rank", tuple(sorted(int(v) for v in values)))

    @classmethod
    def for_context(cls, ctx: CostContext, batch: tuple[int, ...] | None = None,
                    microbatches: tuple[int, ...] = (1, 2, 4, 8), max_tp: int | None = None,
                    max_pp: int = 16, redundant_per_rank: tuple[int, ...] = (0,)) -> SearchSpace:
        """The default space: powers of two up to the cluster (tp capped at one node's width by
        default, as TP across nodes is never competitive), ep over the expert count, pp <= 16.
        ``redundant_per_rank`` is kept only where replicas can lower the proxy's cost
        (:func:`replicas_can_help`), else it is ``(0,)``."""
        n, m = ctx.cluster.num_gpus, ctx.model
        tp_cap = max_tp or min(n, max(ctx.cluster.nvlink_domain_size, 8))
        tp = tuple(v for v in powers_of_two(tp_cap) if v <= n)
        ep = tuple(v for v in powers_of_two(min(n, m.num_experts)) if m.num_experts % v == 0) if m.is_moe else (1,)
        pp = tuple(v for v in powers_of_two(min(n, max_pp, m.num_layers)))
        batch = batch or powers_of_two(4096)
        redundant = tuple(sorted({0, *(int(v) for v in redundant_per_rank)}))
        if not replicas_can_help(ctx, ep):
            redundant = (0,)
        return cls(n, tp, ep, pp, tuple(batch), tuple(microbatches), redundant)

    def redundant_options(self, ep: int) -> tuple[int, ...]:
        """``strategy.redundant_experts`` values of a plan at expert-parallel degree ``ep``."""
        return tuple(v * int(ep) for v in self.redundant_per_rank)

    def with_redundant(self, rows: np.ndarray) -> np.ndarray:
        """Degree rows ``[n, 6]`` extended by every redundant-experts option of their ``ep``:
        ``[n * len(redundant_per_rank), 7]``, each row's options together, in ascending order (0 first)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1, 6)
        k = np.asarray(self.redundant_per_rank, dtype=np.int64)
        out = np.repeat(rows, len(k), axis=0)
        return np.concatenate([out, (out[:, 1] * np.tile(k, len(rows)))[:, None]], axis=1)

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
