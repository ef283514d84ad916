"""A serving plan: one aggregated pool, or a prefill pool and a decode pool (disaggregated).

A pool is ``workers`` replicas of one :class:`~simcore.strategy.Strategy` (its ``tp``, ``ep`` and
``pp``; ``dp`` and ``batch`` are not used: ``workers`` replicates and ``max_num_seqs`` caps the running
sequences of a worker). ``ep > 1`` means ``ep`` data-parallel attention groups whose experts are split
``ep`` ways (SGLang's ``--enable-dp-attention`` with ``--ep-size``, TensorRT-LLM's attention DP).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..strategy import Strategy
from .requests import ServingInputError

__all__ = ["Pool", "ServingPlan", "MODES"]

MODES = ("agg", "disagg")


@dataclass(frozen=True)
class Pool:
    strategy: Strategy
    workers: int = 1
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ServingInputError(f"pool.workers must be a positive integer, got {self.workers!r}")
        if isinstance(self.max_num_seqs, bool) or not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ServingInputError(f"pool.max_num_seqs must be a positive integer, got {self.max_num_seqs!r}")

    @property
    def gpus_per_worker(self) -> int:
        s = self.strategy
        return s.tp * s.ep * s.pp

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    def describe(self) -> str:
        s = self.strategy
        return f"{self.workers}x(tp{s.tp} ep{s.ep} pp{s.pp}, seqs {self.max_num_seqs})"

    def to_dict(self) -> dict:
        s = self.strategy
        return {"tp": s.tp, "ep": s.ep, "pp": s.pp, "workers": self.workers, "max_num_seqs": self.max_num_seqs,
                "sharding": dict(s.sharding)}


@dataclass(frozen=True)
class ServingPlan:
    """``mode`` ``agg``: ``pool`` serves everything; ``disagg``: ``prefill`` then ``decode``."""

    mode: str
    pool: Pool | None = None
    prefill: Pool | None = None
    decode: Pool | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ServingInputError(f"plan.mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mode == "agg" and self.pool is None:
            raise ServingInputError("plan.pool: an aggregated plan needs a pool")
        if self.mode == "disagg" and (self.prefill is None or self.decode is None):
            raise ServingInputError("plan.prefill / plan.decode: a disaggregated plan needs both pools")

    @classmethod
    def aggregated(cls, strategy: Strategy, workers: int = 1, max_num_seqs: int = 256) -> ServingPlan:
        return cls("agg", pool=Pool(strategy, workers, max_num_seqs))

    @classmethod
    def disaggregated(cls, prefill: Pool, decode: Pool) -> ServingPlan:
        return cls("disagg", prefill=prefill, decode=decode)

    @property
    def pools(self) -> list[tuple[str, Pool]]:
        return [("both", self.pool)] if self.mode == "agg" else [("prefill", self.prefill), ("decode", self.decode)]

    @property
    def gpus(self) -> int:
        return sum(p.gpus for _, p in self.pools)

    def describe(self) -> str:
        if self.mode == "agg":
            return f"agg {self.pool.describe()}"
        return f"disagg P {self.prefill.describe()} + D {self.decode.describe()}"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "gpus": self.gpus} | {role: p.to_dict() for role, p in self.pools}
