"""A serving plan: one aggregated pool, a prefill pool and a decode pool (disaggregated), or one pool
whose workers re-shard between a prefill and a decode layout (Seesaw, :mod:`.seesaw`).

A pool is ``workers`` replicas of one :class:`~simcore.strategy.Strategy` (its ``tp``, ``ep`` and
``pp``; ``dp`` and ``batch`` are not used: ``workers`` replicates and ``max_num_seqs`` caps the running
sequences of a worker). ``ep > 1`` means ``ep`` data-parallel attention groups whose experts are split
``ep`` ways (SGLang's ``--enable-dp-attention`` with ``--ep-size``, TensorRT-LLM's attention DP).

A ``seesaw`` plan holds its two layouts as ``prefill`` and ``decode`` pools of the same ``workers`` and
``max_num_seqs`` over the same GPUs (``tp * ep * pp`` equal); ``host_kv_bytes_per_gpu`` is the host
(CPU) memory per GPU that parks prefilled requests' KV until the worker switches to decode: by default
a DGX/HGX H100 or H200 node's 2 TB of system memory over its 8 GPUs (NVIDIA DGX H100/H200 user guide,
"System memory: 2 TB"), 250 GB.

A pool's strategy carries the per-operator layout the serving runtimes give a tensor-parallel group
(:func:`runtime_sharding`), not Megatron-LM training's: the runtimes run the MoE router on the whole
hidden state on every rank, so an MoE layer all-reduces twice, as a dense layer does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..strategy import Strategy, megatron_sharding
from .requests import ServingInputError

__all__ = ["Pool", "ServingPlan", "MODES", "HOST_KV_BYTES_PER_GPU", "runtime_sharding", "runtime_strategy"]

MODES = ("agg", "disagg", "seesaw")
#: Host memory per GPU for a seesaw worker's parked KV: 2 TB per 8-GPU DGX H100/H200 node (module docstring).
HOST_KV_BYTES_PER_GPU = 2e12 / 8


def runtime_sharding() -> dict[str, str]:
    """The per-operator layout vLLM, SGLang and TensorRT-LLM give a tensor-parallel group.

    Megatron's column-parallel QKV and FFN1, row-parallel output projection and FFN2, except the MoE
    router: each rank runs the gate on the whole all-reduced hidden state (vLLM's ``ReplicatedLinear``
    gate in ``qwen3_moe.py``, ``deepseek_v2.py`` and ``gpt_oss.py``, where the attention output's
    ``RowParallelLinear`` all-reduces and the experts' output is all-reduced once; SGLang's models the
    same; TensorRT-LLM's gate after its fused all-reduce and RMSNorm). An MoE layer then communicates as a
    dense one: two all-reduces. :func:`~simcore.strategy.megatron_sharding`'s token-split router instead
    reduce-scatters the attention output, then all-gathers it and the residual back for the experts: four
    collectives where the runtimes run two, each paying NCCL's latency at decode sizes.

    The layout table (:mod:`simcore.opgraph`) has no replicated-in, replicated-out linear operator;
    ``dim1`` takes the replicated input the runtimes give the gate and prices its GEMM at ``1/tp`` of
    the expert logits, a few microseconds either way.
    """
    return megatron_sharding() | {"router": "dim1"}


def runtime_strategy(tp: int = 1, ep: int = 1, pp: int = 1) -> Strategy:
    """A serving worker's strategy: ``tp`` x ``ep`` (attention-DP groups) x ``pp`` with the runtimes'
    layout (:func:`runtime_sharding`)."""
    return Strategy(tp=tp, ep=ep, pp=pp, sharding=runtime_sharding())


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
    """``mode`` ``agg``: ``pool`` serves everything; ``disagg``: ``prefill`` then ``decode``; ``seesaw``:
    each worker runs the ``prefill`` layout, then the ``decode`` layout, on the same GPUs."""

    mode: str
    pool: Pool | None = None
    prefill: Pool | None = None
    decode: Pool | None = None
    host_kv_bytes_per_gpu: float = HOST_KV_BYTES_PER_GPU  # seesaw only
    #: speculative decoding's draft tokens per step on the decoding workers (0: off); ``None``: the
    #: runtime profile's own (``serving.spec_tokens``). A planner that searches it sets it.
    spec_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ServingInputError(f"plan.mode: {self.mode!r} is not one of {', '.join(MODES)}")
        k = self.spec_tokens
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ServingInputError(f"plan.spec_tokens must be an integer >= 0, got {k!r}")
        if self.mode == "agg" and self.pool is None:
            raise ServingInputError("plan.pool: an aggregated plan needs a pool")
        if self.mode == "disagg" and (self.prefill is None or self.decode is None):
            raise ServingInputError("plan.prefill / plan.decode: a disaggregated plan needs both pools")
        if self.mode == "seesaw":
            self._check_seesaw()

    def _check_seesaw(self) -> None:
        p, d = self.prefill, self.decode
        if p is None or d is None:
            raise ServingInputError("plan.prefill / plan.decode: a seesaw plan needs both layouts")
        if d.gpus_per_worker != p.gpus_per_worker:
            raise ServingInputError(f"plan.decode: a seesaw worker re-shards over the same GPUs, but the decode "
                                    f"layout uses {d.gpus_per_worker} GPUs (tp*ep*pp) and the prefill layout "
                                    f"{p.gpus_per_worker}")
        if (d.workers, d.max_num_seqs) != (p.workers, p.max_num_seqs):
            raise ServingInputError("plan.decode: a seesaw plan's two layouts share workers and max_num_seqs")
        h = self.host_kv_bytes_per_gpu
        if isinstance(h, bool) or not isinstance(h, int | float) or not (h > 0 and math.isfinite(h)):
            raise ServingInputError(f"plan.host_kv_bytes_per_gpu must be a positive number of bytes, got {h!r}")

    @classmethod
    def aggregated(cls, strategy: Strategy, workers: int = 1, max_num_seqs: int = 256) -> ServingPlan:
        return cls("agg", pool=Pool(strategy, workers, max_num_seqs))

    @classmethod
    def disaggregated(cls, prefill: Pool, decode: Pool) -> ServingPlan:
        return cls("disagg", prefill=prefill, decode=decode)

    @classmethod
    def seesaw(cls, prefill_strategy: Strategy, decode_strategy: Strategy, workers: int = 1, max_num_seqs: int = 256,
               host_kv_bytes_per_gpu: float = HOST_KV_BYTES_PER_GPU) -> ServingPlan:
        """``workers`` workers, each re-sharding between the two strategies over the same GPUs."""
        return cls("seesaw", prefill=Pool(prefill_strategy, workers, max_num_seqs),
                   decode=Pool(decode_strategy, workers, max_num_seqs), host_kv_bytes_per_gpu=host_kv_bytes_per_gpu)

    @property
    def pools(self) -> list[tuple[str, Pool]]:
        """``(role, pool)``; a seesaw plan's two entries are two layouts of the same workers."""
        return [("both", self.pool)] if self.mode == "agg" else [("prefill", self.prefill), ("decode", self.decode)]

    @property
    def gpus(self) -> int:
        if self.mode == "seesaw":
            return self.prefill.gpus
        return sum(p.gpus for _, p in self.pools)

    def describe(self) -> str:
        spec = "" if self.spec_tokens is None else f", spec {self.spec_tokens}"
        if self.mode == "agg":
            return f"agg {self.pool.describe()}{spec}"
        if self.mode == "seesaw":
            p, d = self.prefill.strategy, self.decode.strategy
            return (f"seesaw {self.prefill.workers}x(P tp{p.tp} ep{p.ep} pp{p.pp} <-> D tp{d.tp} ep{d.ep} pp{d.pp}, "
                    f"seqs {self.prefill.max_num_seqs}){spec}")
        return f"disagg P {self.prefill.describe()} + D {self.decode.describe()}{spec}"

    def runtime_for(self, runtime):
        """``runtime`` (a :class:`~simcore.serving.RuntimeProfile`) with this plan's speculative decoding."""
        return runtime if self.spec_tokens is None else runtime.with_overrides(spec_tokens=self.spec_tokens)

    def to_dict(self) -> dict:
        out = {"mode": self.mode, "gpus": self.gpus} | {role: p.to_dict() for role, p in self.pools}
        if self.mode == "seesaw":
            out["host_kv_bytes_per_gpu"] = self.host_kv_bytes_per_gpu
        if self.spec_tokens is not None:
            out["spec_tokens"] = self.spec_tokens
        return out
