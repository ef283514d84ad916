"""What is being served: phase, precision, sequence lengths and latency targets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from simcore.hardware.gpus import PRECISION_BYTES

__all__ = ["Workload", "PHASES"]

PHASES = ("prefill", "decode", "static")


@dataclass(frozen=True)
class Workload:
    """One serving scenario.

    - ``prefill``: a batch of prompts of ``input_len`` tokens; the step is the time to first token.
    - ``decode``: steady decode, each sequence attends to ``input_len`` tokens of context.
    - ``static``: a static batch: prefill of ``input_len`` tokens, then ``output_len`` decode steps with a
      KV cache growing from ``input_len`` to ``input_len + output_len``.

    ``precision`` sets weights and GEMMs (``bf16`` | ``fp8``); activations stay 16-bit. The KV cache is
    stored at ``kv_precision`` (``None``: at ``precision``).
    SLOs are in seconds; ``None`` means no target.
    """

    phase: str = "decode"
    precision: str = "bf16"
    input_len: int = 2048
    output_len: int = 128
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    activation_bytes: float = 2.0  # bf16 activations between kernels
    #: Bytes per routed-expert weight when experts are quantized below ``precision``, their block
    #: scales included (weight-only 4-bit experts: gpt-oss MXFP4 0.53125, 4 bits plus an 8-bit scale
    #: per 32; Kimi-K2.5's group-32 INT4 with BF16 scales 0.5625); ``None``: experts at ``precision``.
    expert_weight_bytes: float | None = None
    #: Decode attention kernel generation: the fraction of a KV head's bytes each further query head
    #: of its group re-reads from HBM. 0: today's kernels (FlashInfer, FlashAttention, TensorRT-LLM
    #: XQA) load each KV head once for its whole group; > 0: a masked-MHA kernel with one thread
    #: block per query head (TensorRT-LLM before XQA), whose re-reads L2 only partly catches.
    decode_kv_reread: float = 0.0
    #: The KV cache's element type (``bf16`` | ``fp8``; ``None``: ``precision``). A runtime's own choice,
    #: not the checkpoint's weights': vLLM's and SGLang's ``--kv-cache-dtype auto`` store KV in the
    #: model's activation dtype (BF16) even for FP8 weights, unless a flag or the checkpoint says FP8.
    kv_precision: str | None = None
    #: How the runtime launches kernels (:mod:`simcore.cost.host`). ``True``: CUDA-graph replay, each kernel's
    #: fixed cost ``RuntimeProfile.graph_kernel_s`` (vLLM, SGLang, TensorRT-LLM's PyTorch backend in
    #: decode). ``False`` (default): eager launches at ``GpuSpec.kernel_overhead_s`` each, as the static
    #: inference rows ran: TensorRT-LLM's C++ benchmarks (``gptSessionBenchmark``, ``gptManagerBenchmark``)
    #: launch eagerly from C++ unless ``--enable_cuda_graph`` is passed, which none of those rows names.
    cuda_graphs: bool = False
    #: Host launch cost per kernel outside a graph (s): a stage takes at least its kernels times this.
    #: 0: a C++ runtime, whose launches stay under each kernel's fixed cost; Python eager: 6e-6.
    launch_s: float = 0.0
    #: Whether the host prepares step ``k + 1`` while step ``k`` runs (a step takes ``max(GPU, host)``)
    #: instead of between steps (``GPU + host``). TensorRT-LLM's C++ session loop is synchronous.
    host_overlap: bool = False

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"workload.phase: {self.phase!r} is not one of {', '.join(PHASES)}")
        if self.precision not in PRECISION_BYTES:
            raise ValueError(f"workload.precision: {self.precision!r} is not one of {', '.join(PRECISION_BYTES)}")
        if not isinstance(self.input_len, int) or self.input_len < 1:
            raise ValueError(f"workload.input_len must be a positive integer, got {self.input_len!r}")
        if not isinstance(self.output_len, int) or self.output_len < 1:
            raise ValueError(f"workload.output_len must be a positive integer, got {self.output_len!r}")
        if self.kv_precision is not None and self.kv_precision not in PRECISION_BYTES:
            raise ValueError(f"workload.kv_precision: {self.kv_precision!r} is not one of "
                             f"{', '.join(PRECISION_BYTES)} (or null: as workload.precision)")
        if not 0.0 <= self.decode_kv_reread <= 1.0:
            raise ValueError(f"workload.decode_kv_reread must be in [0, 1], got {self.decode_kv_reread!r}")
        if not (self.launch_s >= 0 and math.isfinite(self.launch_s)):
            raise ValueError(f"workload.launch_s must be finite and >= 0, got {self.launch_s!r}")
        if self.expert_weight_bytes is not None and not 0 < self.expert_weight_bytes <= self.weight_bytes:
            raise ValueError(f"workload.expert_weight_bytes must be in (0, {self.weight_bytes}], "
                             f"got {self.expert_weight_bytes!r}")
        for name in ("ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"workload.{name} must be positive, got {value!r}")

    @property
    def weight_bytes(self) -> float:
        return PRECISION_BYTES[self.precision]

    @property
    def expert_bytes(self) -> float:
        """Bytes per routed-expert weight element."""
        return self.weight_bytes if self.expert_weight_bytes is None else float(self.expert_weight_bytes)

    @property
    def kv_bytes(self) -> float:
        return PRECISION_BYTES[self.kv_precision or self.precision]

    @property
    def max_context(self) -> int:
        """Longest context any KV cache holds during the step."""
        return self.input_len + (self.output_len if self.phase == "static" else 0)
