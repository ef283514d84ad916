"""A runtime's launch flags, runtime by runtime, and the profile fields each sets.

Each field of :class:`LaunchFlags` is one setting the three runtimes spell differently; ``None`` keeps the
runtime profile's value (:mod:`simcore.serving.runtime`, where each field's meaning and source is given):

- ``max_num_batched_tokens``: the tokens one step may carry, which is also the chunk a long prompt is
  prefilled in (vLLM ``--max-num-batched-tokens``, SGLang ``--chunked-prefill-size``, TensorRT-LLM
  ``max_num_tokens``) -> ``RuntimeProfile.max_num_batched_tokens``.
- ``cuda_graph_max_bs``: the largest step replayed from a captured CUDA graph, in tokens (vLLM
  ``max-cudagraph-capture-size`` / ``--max-seq-len-to-capture``, SGLang ``--cuda-graph-max-bs``, TensorRT-LLM
  ``cuda_graph_config.max_batch_size``; decode steps carry one token a sequence) -> ``graph_max_tokens``.
- ``async_scheduling``: the host's step overlapped with the GPU's previous one (vLLM ``--async-scheduling``
  / ``--no-async-scheduling``, its default from v0.14; SGLang's overlap scheduler, off with
  ``--disable-overlap-schedule``; TensorRT-LLM's, off with ``disable_overlap_scheduler``) -> ``overlap_host``.
- ``deep_gemm_moe``: vLLM's DeepGEMM MoE path for FP8 experts, each local expert's rows padded to DeepGEMM's
  128-row block (``VLLM_USE_DEEP_GEMM`` / ``VLLM_MOE_USE_DEEP_GEMM``; by default on from v0.12 to v0.14 unless
  the experts split 8 ways by TP, :mod:`.versions`) -> ``moe_padded_rows`` 128 or 0.
- ``batch_wait_timeout_iters``, ``batch_wait_max_tokens_ratio``: TensorRT-LLM's batch waiting (``LlmArgs``)
  -> the fields of the same names.
- ``attention_dp_balance``, ``attention_dp_timeout_iters``, ``attention_dp_batching_wait_iters``: TensorRT-LLM's
  ``attention_dp_config`` (``enable_balance``, ``timeout_iters``, ``batching_wait_iters``) -> the fields of
  the same names.
- ``moe_a2a_backend``: the expert-parallel dispatch and combine (SGLang ``--moe-a2a-backend``: ``none`` for
  NCCL, ``deepep`` for DeepEP's kernels) -> ``moe_a2a_backend``.
- ``two_batch_overlap``: SGLang's ``--enable-two-batch-overlap`` (a step's expert all-to-alls hidden behind
  the other micro-batch's compute) -> ``two_batch_overlap``; refused on the runtimes that have none.
- ``mamba_ssm_dtype``: the recurrent state's element type of a model's linear-attention layers (SGLang and
  vLLM ``--mamba-ssm-dtype``: ``bf16`` or ``fp32``), a model field rather than a profile's
  (``ModelSpec.linear_state_bytes``: 2 or 4; :meth:`LaunchFlags.model_fields`).

The memory fraction, the fourth flag every launch sets, is ``ServingConfig.mem_fraction``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simcore.serving.deployment.versions import DEEPGEMM_BLOCK_ROWS
from simcore.serving.requests import ServingInputError
from simcore.serving.runtime import MOE_A2A_BACKENDS, RuntimeProfile

__all__ = ["LaunchFlags", "PROFILE_FIELD", "TRTLLM_ONLY", "STATE_BYTES"]

#: the profile field each flag sets where the names differ (the others set the field of their own name)
PROFILE_FIELD = {"cuda_graph_max_bs": "graph_max_tokens", "async_scheduling": "overlap_host",
                 "deep_gemm_moe": "moe_padded_rows"}
#: flags only TensorRT-LLM reads (its scheduler's batch waiting and attention-DP balancing)
TRTLLM_ONLY = ("batch_wait_timeout_iters", "batch_wait_max_tokens_ratio", "attention_dp_balance",
               "attention_dp_timeout_iters", "attention_dp_batching_wait_iters")
#: bytes per element of a ``mamba_ssm_dtype``
STATE_BYTES = {"bf16": 2, "fp32": 4}


@dataclass(frozen=True)
class LaunchFlags:
    """A launch's flags (module doc); ``None``: the profile's value. Errors name ``serving.<flag>``."""

    max_num_batched_tokens: int | None = None
    cuda_graph_max_bs: int | None = None
    async_scheduling: bool | None = None
    deep_gemm_moe: bool | None = None
    batch_wait_timeout_iters: int | None = None
    batch_wait_max_tokens_ratio: float | None = None
    attention_dp_balance: bool | None = None
    attention_dp_timeout_iters: int | None = None
    attention_dp_batching_wait_iters: int | None = None
    moe_a2a_backend: str | None = None
    mamba_ssm_dtype: str | None = None
    two_batch_overlap: bool | None = None

    def __post_init__(self) -> None:
        for name, least in (("max_num_batched_tokens", 1), ("cuda_graph_max_bs", 0), ("batch_wait_timeout_iters", 0),
                            ("attention_dp_timeout_iters", 0), ("attention_dp_batching_wait_iters", 0)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
                raise ServingInputError(f"serving.{name} must be an integer >= {least} (or null), got {v!r}")
        for name in ("async_scheduling", "deep_gemm_moe", "attention_dp_balance", "two_batch_overlap"):
            if getattr(self, name) not in (None, True, False):
                raise ServingInputError(f"serving.{name} must be true, false or null, got {getattr(self, name)!r}")
        ratio = self.batch_wait_max_tokens_ratio
        if ratio is not None and not 0 <= ratio <= 1:
            raise ServingInputError(f"serving.batch_wait_max_tokens_ratio must be in [0, 1] (or null), got {ratio!r}")
        if self.moe_a2a_backend not in (None, *MOE_A2A_BACKENDS):
            raise ServingInputError(f"serving.moe_a2a_backend: {self.moe_a2a_backend!r} is not one of "
                                    f"{', '.join(MOE_A2A_BACKENDS)} (or null)")
        if self.mamba_ssm_dtype not in (None, *STATE_BYTES):
            raise ServingInputError(f"serving.mamba_ssm_dtype: {self.mamba_ssm_dtype!r} is not one of "
                                    f"{', '.join(STATE_BYTES)} (or null: the model config's)")

    def set_flags(self) -> dict:
        """The flags given (not ``None``), by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def profile_fields(self) -> dict:
        """The runtime-profile fields the given flags set (module doc), ``mamba_ssm_dtype`` left out."""
        out = {}
        for name, value in self.set_flags().items():
            if name == "deep_gemm_moe":
                value = DEEPGEMM_BLOCK_ROWS if value else 0
            if name != "mamba_ssm_dtype":
                out[PROFILE_FIELD.get(name, name)] = value
        return out

    def apply(self, profile: RuntimeProfile) -> RuntimeProfile:
        """``profile`` with the given flags' fields; a TensorRT-LLM-only flag on another runtime is refused."""
        wrong = [name for name in TRTLLM_ONLY if getattr(self, name) is not None and profile.scheduler != "trtllm"]
        if wrong:
            raise ServingInputError(f"serving.{wrong[0]}: a TensorRT-LLM setting; runtime {profile.name} is "
                                    f"{profile.scheduler}'s")
        if self.two_batch_overlap and profile.scheduler != "sglang":
            raise ServingInputError(f"serving.two_batch_overlap: SGLang's --enable-two-batch-overlap; runtime "
                                    f"{profile.name} ({profile.scheduler}) has none")
        fields = self.profile_fields()
        return profile.with_overrides(**fields) if fields else profile

    def model_fields(self, model) -> dict:
        """The model fields (``ModelSpec``) the given flags set: the linear-attention state's bytes."""
        if self.mamba_ssm_dtype is None:
            return {}
        if not getattr(model, "linear_layers", None):
            raise ServingInputError(f"serving.mamba_ssm_dtype: model {model.name} has no linear-attention layers")
        return {"linear_state_bytes": STATE_BYTES[self.mamba_ssm_dtype]}
