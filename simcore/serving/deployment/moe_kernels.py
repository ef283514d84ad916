"""The MoE kernels a runtime runs a row's experts with, where they are not the ones its profile prices.

Profile ``trtllm``'s MoE constants price TensorRT-LLM's CUTLASS grouped GEMMs, fitted on its DeepSeek
rows. TensorRT-LLM runs an MXFP4 checkpoint's experts (gpt-oss) on a Hopper GPU through another kernel
family, its ``TritonFusedMoE``. That is OpenAI's ``triton_kernels`` ``matmul_ogs``, a Triton grouped GEMM
over sorted tokens, with BF16 activations. It runs whatever the launch sets. The sources:

- When gpt-oss came out, nothing else ran on Hopper. The gpt-oss deployment blog, as NVIDIA/TensorRT-LLM
  PR #7101 (2025-08) left it, says the TRTLLM MoE backend does not support Hopper and CUTLASS support was
  not done, and tells H100 and H200 users to set ``moe_config.backend: TRITON``.
- From then on it is the default. The deployment guide's MoE backend support matrix (1.2 and later)
  lists TRITON for Hopper with BF16 activations and MXFP4 weights, as the Hopper default. The 1.3
  release notes (PR #19035) say ``AUTO`` resolves to TRITON in this one case, W4A16 MXFP4 on SM90.
- InferenceX's H200 launch (``gptoss_fp4_h200_trt.sh``) sets it explicitly.

So every such row takes these kernels, on H100 or H200, at any lengths. :func:`moe_kernel_fields`
gives the runtime-profile fields that price them. Other rows keep their profile's MoE constants.

``matmul_ogs`` has not been timed here; the nearest measured kernel family is Triton's ``fused_moe``.
So these rows take that family's MoE block (:data:`TRITON_MOE_FIELDS`); the rest is TensorRT-LLM's:

- **Prefill sizes.** The compute rate and FP8 at the BF16 rate are taken as profile ``vllm`` has them.
  That is 0.25 of a dense BF16 GEMM's rate, fitted on the fit set's MoE prefills. The kernel's published
  BF16 timings at their own shapes give 0.35; the serving shapes, experts split by tensor parallelism,
  run slower (:mod:`simcore.serving.runtime`).
- **Decode sizes.** The HBM share and the fixed time per call come from the kernel's own published
  timings at 1-64 tokens (:data:`TRITON_FUSED_MOE_DECODE`, ``python -m validation.studies.moe.fit_kernels
  --decode``).
- **Not profile ``vllm``'s decode pair** (0.5, 25 us). That pair is fitted on vLLM's serving rows. On
  those kernel timings it scores 0.48 median |log error|, against the fit's 0.05. It carries time vLLM's
  steps spend that the kernel does not (validation/reports/serving/history.md); that time is vLLM's, not
  TensorRT-LLM's.

Using one kernel family for another is an assumption. The substitution was chosen before the test rows
were simulated with it; its decode pair moved from profile ``vllm``'s to the kernel timings' after, as
the history says. One contrary point stands: an H100 ``triton_kernels`` repro at a forced tile runs
``matmul_ogs`` at ~60% of peak HBM bandwidth, where the pair gives 90% (README).

vLLM's gpt-oss rows keep profile ``vllm``'s MoE constants; their experts run Marlin's weight-only
kernels, not timed here. What Marlin changes is the bytes: vLLM holds MXFP4 experts padded to its tiles,
which the GPU loads and reads (:func:`vllm_mxfp4_padding`, :func:`simcore.models.quantization.marlin_padding`). Marlin
is what InferenceX's gpt-oss vLLM runs use: ``gptoss_fp4_h200.sh`` and ``gptoss_fp4_h100.sh`` both
``export VLLM_MXFP4_USE_MARLIN=1`` (vLLM's ``get_mxfp4_backend`` otherwise takes ``triton_kernels``'
``matmul_ogs`` on SM90 where that package is installed, as vLLM's images ship it, and Marlin where it is
not). A vLLM launch whose kernel is not known (the KV-cache logs of ``validation.studies.serving.kv_capacity``, any CSV
row) is priced the same way, chosen on the fit launches' logged weights (llm-d-benchmark, H100, in
sample): gpt-oss-120b and -20b at TP 1 load 64.38 and 13.47 GiB, Marlin's padding gives +2.2% and +1.3%,
Triton's -5.7% and -5.0%; out of sample, gpt-oss-20b at TP 2 (vLLM 0.19, llm-d-planner) loads 7.01 GiB,
Marlin +0.6%, Triton -7.1%. No other runtime's padding was read: TensorRT-LLM's and SGLang's MXFP4
experts keep their bare bytes.
"""

from __future__ import annotations

from simcore.hardware.gpus import get_gpu
from simcore.models.quantization import marlin_padding
from simcore.serving.runtime import get_runtime

__all__ = ["TRITON_FUSED_MOE_DECODE", "TRITON_MOE_FIELDS", "moe_kernel_fields", "triton_moe_fields",
           "vllm_mxfp4_padding"]

#: Triton ``fused_moe`` at decode sizes as its published timings price it: HBM share of a dense GEMM's on
#: the active experts' weights and fixed time per call (``python -m validation.studies.moe.fit_kernels --decode``:
#: 58 rows of 6 sources at 1-64 tokens, median |log error| 0.052; a test holds these equal to its fit)
TRITON_FUSED_MOE_DECODE = {"moe_memory_efficiency": 1.0, "moe_layer_s": 20e-6}
#: The runtime-profile fields that price the MoE block's kernels; the Triton MoE kernels take the
#: prefill-size pair from profile ``vllm`` and the decode-size pair from the kernel's own timings,
#: :data:`TRITON_FUSED_MOE_DECODE` (module doc)
TRITON_MOE_FIELDS = ("moe_gemm_efficiency", "moe_fp8_at_bf16_rate", "moe_memory_efficiency", "moe_layer_s")


def triton_moe_fields() -> dict:
    """The runtime-profile fields of the Triton MoE kernels (module doc), all of :data:`TRITON_MOE_FIELDS`."""
    vllm = get_runtime("vllm")
    prefill = {f: getattr(vllm, f) for f in TRITON_MOE_FIELDS if f not in TRITON_FUSED_MOE_DECODE}
    return prefill | TRITON_FUSED_MOE_DECODE


def moe_kernel_fields(backend: str, expert_format: str | None, gpu: str) -> dict:
    """Runtime-profile fields for the MoE kernels the runtime runs these experts with (empty: the
    profile's own). ``expert_format``: the routed experts' 4-bit format (:func:`simcore.models.quantization.expert_format`),
    ``None`` for experts that are not 4-bit; ``gpu``: a :data:`simcore.hardware.gpus.GPUS` name.
    TensorRT-LLM with MXFP4 experts on Hopper: the Triton MoE kernels (module doc)."""
    if backend == "trtllm" and expert_format == "mxfp4" and get_gpu(gpu).arch == "hopper":
        return triton_moe_fields()
    return {}


def vllm_mxfp4_padding(backend: str, expert_format: str | None, gpu: str, hidden: int, expert_ffn: int,
                       expert_tp: int) -> float:
    """Factor on each routed-expert weight's bytes of a row: Marlin's padding (module doc) for vLLM's MXFP4
    experts on a Hopper GPU, their intermediate size ``expert_ffn`` split ``expert_tp`` ways as vLLM
    shards it; 1.0 for any other row."""
    if backend != "vllm" or expert_format != "mxfp4" or get_gpu(gpu).arch != "hopper":
        return 1.0
    if expert_tp < 1 or expert_ffn % expert_tp:
        raise ValueError(f"layout: an expert intermediate size of {expert_ffn} does not split {expert_tp} ways")
    return marlin_padding(hidden, expert_ffn // expert_tp)
