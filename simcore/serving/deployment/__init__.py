"""A deployment's settings beyond its plan, and what each does to the simulated run.

A serving plan says how many GPUs run which layout; a deployment also says which release of the runtime
runs it, in which format the checkpoint's experts are stored, which type the KV cache is stored in, and
the runtime's launch flags. Each changes the simulated step, and each is a field of
``shard-sim workload=serving`` (``serving.*``) and of the serving study's rows alike:

- :mod:`.versions`: what a runtime's release does by default (vLLM's host step overlapped from v0.14,
  its DeepGEMM MoE path for FP8 experts in v0.12-v0.14);
- :mod:`.kv_dtype`: the KV cache's element type a runtime picks without a flag, by its version;
- :mod:`.moe_kernels`: the MoE kernels a runtime runs a format's experts with on a GPU, where they are not
  its profile's (TensorRT-LLM's Triton MoE for MXFP4 on Hopper; vLLM's Marlin MXFP4 padding);
- :mod:`.flags`: the launch flags (token budget, CUDA-graph sizes, async scheduling, batch waiting,
  attention-DP balancing, the expert-parallel backend, the linear-attention state's type);
- :mod:`simcore.models.quantization`: the weight formats (4-bit experts' bytes, block scales included).

:class:`Deployment` holds the settings; :meth:`Deployment.runtime_profile` gives the runtime profile they
make of a named one, and :meth:`Deployment.deployed` the context and profile of one plan (what depends on
the plan's layout: the MoE kernels' padding and the version's defaults). A default ``Deployment`` changes
nothing.

Imports: :mod:`simcore.serving.runtime` and :mod:`simcore.serving.requests`, :mod:`simcore.models.quantization`,
:mod:`simcore.hardware`; never :mod:`simcore.serving`'s package entry or its simulator, which import it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from simcore.models.quantization import EXPERT_FORMATS, FORMAT_BYTES
from simcore.serving.deployment.flags import LaunchFlags
from simcore.serving.deployment.kv_dtype import runtime_kv_dtype
from simcore.serving.deployment.moe_kernels import moe_kernel_fields, triton_moe_fields, vllm_mxfp4_padding
from simcore.serving.deployment.versions import (
    parse_version,
    runtime_profile_name,
    version_defaults,
    vllm_moe_tp,
)
from simcore.serving.requests import ServingInputError
from simcore.serving.runtime import RuntimeProfile, get_runtime

__all__ = ["Deployment", "LaunchFlags", "MOE_BACKENDS", "parse_version", "runtime_profile_name", "version_defaults",
           "vllm_moe_tp", "runtime_kv_dtype", "moe_kernel_fields", "triton_moe_fields", "vllm_mxfp4_padding"]

#: ``Deployment.moe_backend``: ``None`` the runtime's choice for the experts' format on the GPU
#: (:func:`moe_kernel_fields`); ``triton`` Triton's MoE kernels (TensorRT-LLM ``moe_config.backend: TRITON``);
#: ``profile`` the runtime profile's own MoE constants whatever the format
MOE_BACKENDS = ("triton", "profile")


@dataclass(frozen=True)
class Deployment:
    """What runs a plan beyond its layout (module doc). ``runtime_version``: the runtime's release
    (``0.12.0``; ``None``: the profile as it is, today's defaults); ``expert_format``: the routed experts'
    storage format (a key of :data:`simcore.models.quantization.EXPERT_FORMATS`; ``None``: at the workload's
    precision), whose bytes the caller puts in ``Workload.expert_weight_bytes``; ``moe_backend``: one of
    :data:`MOE_BACKENDS` or ``None``; ``flags``: the launch flags."""

    runtime_version: str | None = None
    expert_format: str | None = None
    moe_backend: str | None = None
    flags: LaunchFlags = field(default_factory=LaunchFlags)

    def __post_init__(self) -> None:
        if self.runtime_version is not None and parse_version(str(self.runtime_version)) is None:
            raise ServingInputError(f"serving.runtime_version: {self.runtime_version!r} is not a release "
                                    f"(MAJOR.MINOR..., e.g. 0.12.0; null: the runtime as its profile has it)")
        if self.expert_format is not None and self.expert_format not in EXPERT_FORMATS:
            raise ServingInputError(f"serving.expert_format: unknown format {self.expert_format!r}; choose one of "
                                    f"{', '.join(EXPERT_FORMATS)} (or null: the checkpoint's)")
        if self.moe_backend not in (None, *MOE_BACKENDS):
            raise ServingInputError(f"serving.moe_backend: {self.moe_backend!r} is not one of "
                                    f"{', '.join(MOE_BACKENDS)} (or null: the runtime's choice)")

    @property
    def version(self) -> tuple[int, int] | None:
        return parse_version(self.runtime_version)

    def runtime_profile(self, name: str) -> RuntimeProfile:
        """Profile ``name`` at this release (:func:`runtime_profile_name`) with the launch flags."""
        return self.flags.apply(get_runtime(runtime_profile_name(name, self.version)))

    def kv_dtype(self, scheduler: str, model_id: str, precision: str) -> str:
        """The KV cache's element type runtime ``scheduler`` picks at this release without a flag
        (:func:`runtime_kv_dtype`)."""
        return runtime_kv_dtype(scheduler, self.version, model_id, precision)

    def moe_fields(self, scheduler: str, gpu: str) -> dict:
        """Runtime-profile fields of the MoE kernels running these experts on ``gpu`` (empty: the profile's)."""
        if self.moe_backend == "triton":
            return triton_moe_fields()
        if self.moe_backend == "profile":
            return {}
        return moe_kernel_fields(scheduler, self.expert_format, gpu)

    def deployed(self, ctx, plan, runtime: RuntimeProfile):
        """``(ctx, runtime)`` of ``plan`` under this deployment: ``runtime`` (:meth:`runtime_profile`'s) with
        its MoE kernels and, unless a flag says otherwise, its release's defaults for the plan's layout (the
        decode pool's); ``ctx`` with the experts' bytes padded as the runtime holds them. Pools whose experts
        pad differently are refused (:class:`ServingInputError`)."""
        model, w = ctx.model, ctx.workload
        fields = self.moe_fields(runtime.scheduler, ctx.cluster.gpu.name) if model.is_moe else {}
        if self.flags.deep_gemm_moe is None:
            pool = plan.pools[-1][1]
            moe_tp = vllm_moe_tp(pool.strategy.tp, pool.strategy.ep * pool.moe_ep)
            fields |= version_defaults(runtime.scheduler, self.version, model.is_moe, w.precision, moe_tp)
        if fields:
            runtime = runtime.with_overrides(**fields)
        if not model.is_moe or self.expert_format not in FORMAT_BYTES or w.expert_weight_bytes is None:
            return ctx, runtime
        try:
            factors = {vllm_mxfp4_padding(runtime.scheduler, self.expert_format, ctx.cluster.gpu.name,
                                          model.hidden_size, model.expert_ffn_size, pool.strategy.tp // pool.moe_ep)
                       for _, pool in plan.pools}
        except ValueError as exc:
            raise ServingInputError(f"serving.plan: {exc}") from None
        if len(factors) > 1:
            raise ServingInputError("serving.plan: the pools split their MXFP4 experts to sizes vLLM pads "
                                    "differently; not modelled")
        factor = factors.pop()
        if factor == 1.0:
            return ctx, runtime
        workload = dataclasses.replace(w, expert_weight_bytes=w.expert_weight_bytes * factor)
        return dataclasses.replace(ctx, workload=workload), runtime
