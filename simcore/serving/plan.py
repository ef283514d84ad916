"""A serving plan: one aggregated pool, a prefill pool and a decode pool (disaggregated), or one pool
whose workers re-shard between a prefill and a decode layout (Seesaw, :mod:`.seesaw`).

A pool is ``workers`` replicas of one :class:`~simcore.strategy.sharding.Strategy` (its ``tp``, ``ep`` and
``pp``; ``dp`` and ``batch`` are not used: ``workers`` replicates and ``max_num_seqs`` caps the running
sequences of a worker). ``ep > 1`` means ``ep`` data-parallel attention groups whose experts are split
``ep`` ways (SGLang's ``--enable-dp-attention`` with ``--ep-size``, TensorRT-LLM's attention DP).

``moe_ep`` > 1 splits the routed experts ``moe_ep`` ways whole inside each tensor-parallel group, each
share tensor-parallel over ``tp / moe_ep`` GPUs (TensorRT-LLM's ``moe_ep_size`` with ``moe_tp_size = tp /
moe_ep``, SGLang's ``--ep-size``, vLLM's ``--enable-expert-parallel`` at ``moe_ep = tp``): the attention
stays tensor-parallel and every GPU of the group runs its own experts on the group's replicated tokens,
whose outputs the same all-reduce sums as under expert tensor parallelism (vLLM's ``FusedMoE`` reduces
over the tensor-parallel group whether its experts are split by TP or EP). Same weights per GPU, other
kernels: whole experts make wider GEMMs, and a GPU now waits for its own activated experts, so a step
waits for the busiest one (priced under a sampled routing config, :meth:`.StepCost.expert_load`).
``moe_ep = 1`` is expert tensor parallelism, the default.

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

from simcore.serving.requests import ServingInputError
from simcore.strategy.sharding import Strategy, megatron_sharding

__all__ = ["Pool", "ServingPlan", "MODES", "HOST_KV_BYTES_PER_GPU", "runtime_sharding", "runtime_strategy",
           "check_expert_layout"]

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
    dense one: two all-reduces. :func:`~simcore.strategy.sharding.megatron_sharding`'s token-split router instead
    reduce-scatters the attention output, then all-gathers it and the residual back for the experts: four
    collectives where the runtimes run two, each paying NCCL's latency at decode sizes.

    The layout table (:mod:`simcore.strategy.opgraph`) has no replicated-in, replicated-out linear operator;
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
    #: experts split this many ways whole inside each tensor-parallel group (module docstring); 1: expert TP
    moe_ep: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ServingInputError(f"pool.workers must be a positive integer, got {self.workers!r}")
        if isinstance(self.max_num_seqs, bool) or not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ServingInputError(f"pool.max_num_seqs must be a positive integer, got {self.max_num_seqs!r}")
        g = self.moe_ep
        if isinstance(g, bool) or not isinstance(g, int) or g < 1 or self.strategy.tp % g:
            raise ServingInputError(f"pool.moe_ep must be a positive integer dividing tp ({self.strategy.tp}), "
                                    f"got {g!r}")

    @property
    def gpus_per_worker(self) -> int:
        s = self.strategy
        return s.tp * s.ep * s.pp

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    def describe(self) -> str:
        s = self.strategy
        moe = f" moe_ep{self.moe_ep}" if self.moe_ep > 1 else ""
        return f"{self.workers}x(tp{s.tp} ep{s.ep} pp{s.pp}{moe}, seqs {self.max_num_seqs})"

    def to_dict(self) -> dict:
        s = self.strategy
        out = {"tp": s.tp, "ep": s.ep, "pp": s.pp, "workers": self.workers, "max_num_seqs": self.max_num_seqs,
               "sharding": dict(s.sharding)}
        if self.moe_ep > 1:  # expert-TP pools keep their old form
            out["moe_ep"] = self.moe_ep
        return out


def check_expert_layout(strategy: Strategy, moe_ep: int, model) -> None:
    """A one-line :class:`ServingInputError` when a pool's ``moe_ep`` cannot hold ``model``'s experts: a
    dense model, or routed experts that the ``ep x moe_ep`` expert ranks do not split evenly (the
    runtimes' expert-parallel layers require it: each rank loads ``E / ranks`` whole experts)."""
    if moe_ep == 1:
        return
    if not model.is_moe:
        raise ServingInputError(f"pool.moe_ep: {moe_ep} on {model.name}, which has no routed experts")
    ranks = strategy.ep * moe_ep
    if (model.num_experts + strategy.redundant_experts) % ranks:
        raise ServingInputError(f"pool.moe_ep: {model.name}'s {model.num_experts} routed experts do not split "
                                f"evenly over ep {strategy.ep} x moe_ep {moe_ep} = {ranks} expert ranks")


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
        if p.moe_ep > 1 or d.moe_ep > 1:  # its re-layout prices experts sharded by TP (reshard.py)
            raise ServingInputError("plan.prefill.moe_ep / plan.decode.moe_ep: a seesaw plan's layouts shard "
                                    "their experts by tensor parallelism (moe_ep 1); re-sharding expert-parallel "
                                    "layouts is not modelled")
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
