"""The KV cache's element type a measured row ran with (``Workload.kv_precision``).

It is the runtime's choice, not the weights': an FP8 checkpoint's KV cache is FP8 only where a flag or
the checkpoint asks for it. Getting it wrong halves or doubles decode attention's HBM traffic and the
KV cache's capacity.

1. **A launch flag**, where the measuring harness's script sets one (SemiAnalysis InferenceX, rows at
   its lengths :data:`~.launch.HARNESS_LENGTHS`; scripts under ``benchmarks/`` and
   ``benchmarks/single_node/`` of ``github.com/SemiAnalysisAI/InferenceX``):

   - FP8: TensorRT-LLM DeepSeek-R1/V3 (``dsr1_fp8_h200_trt.sh``: ``kv_cache_config: dtype: fp8``);
     Llama-3.3-70B on vLLM (``70b_fp8_h200_slurm.sh``: ``kv-cache-dtype: fp8``) and on TensorRT-LLM
     (``70b_fp8_h200_trt_slurm.sh``: ``dtype: fp8``); Qwen3.5 on SGLang (``qwen3.5_fp8_h200.sh``:
     ``--kv-cache-dtype fp8_e4m3``).
   - No flag (``auto``, rule 2): DeepSeek-R1 on SGLang (``dsr1_fp8_h200.sh``), gpt-oss on vLLM and on
     TensorRT-LLM (``gptoss_fp4_h200*.sh``: ``dtype: auto``), Kimi-K2.5 (``kimik2.5_int4_h200.sh``).
     MiniMax-M2.5 (``minimaxm2.5_fp8_h200.sh``): one copy of the script passes ``--kv-cache-dtype fp8``,
     another none; which ran a row is not recorded, so, as for its token budget (:mod:`.launch`), the
     default stays.

2. **The runtime's ``auto``** otherwise:

   - vLLM and SGLang store KV in the model's activation dtype (BF16; vLLM's
     ``kv_cache_dtype_str_to_dtype``, SGLang's ``ModelRunner.configure_kv_cache_dtype``), except for a
     ModelOpt checkpoint (NVIDIA's ``nvidia/*-FP8`` ids) that declares FP8 KV (``kv_cache_quant_algo``):
     SGLang follows it, and vLLM from v0.13 (vllm-project/vllm#30785, ``resolve_kv_cache_dtype_string``;
     v0.12 and earlier: model dtype). Block-FP8 checkpoints (DeepSeek, Qwen3, MiniMax: ``quant_method:
     fp8``) declare no KV type: BF16.
   - TensorRT-LLM takes the checkpoint's ``kv_cache_quant_algo`` (``validate_and_set_kv_cache_quant``,
     "Using checkpoint KV quantization"): FP8 for a ModelOpt FP8 checkpoint, BF16 for the rest.

   ModelOpt's FP8 export quantizes the KV cache by default (``hf_ptq.py --kv_cache_qformat fp8``); that
   NVIDIA's published ``*-FP8`` checkpoints declare it is assumed, not read here (their
   ``hf_quant_config.json`` is not shipped).

Rows with 4-bit experts (gpt-oss, Kimi) already run BF16 everywhere on Hopper (:mod:`.mapping`).
"""

from __future__ import annotations

import re

from validation.studies.serving.launch import HARNESS_LENGTHS

__all__ = ["kv_cache_precision", "FP8_KV_LAUNCHES"]

#: (backend, preset prefix) whose InferenceX launch forces an FP8 KV cache (module doc, rule 1)
FP8_KV_LAUNCHES = (("trtllm", "deepseek-"), ("vllm", "llama-3.1-70b"), ("trtllm", "llama-3.1-70b"),
                   ("sglang", "qwen3.5"))


def _version(text: str) -> tuple[int, int] | None:
    found = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def _modelopt_fp8(model_path: str) -> bool:
    """An NVIDIA ModelOpt FP8 checkpoint (module doc: assumed to declare FP8 KV)."""
    org, _, name = model_path.strip().partition("/")
    return org.lower() == "nvidia" and "fp8" in name.lower()


def kv_cache_precision(backend: str, version: str, model_path: str, preset: str, precision: str,
                       isl: int, osl: int) -> str:
    """``bf16`` or ``fp8``: the KV cache's element type of a row (module doc); ``precision`` is the
    mapped weights' (``Workload.precision``)."""
    if precision != "fp8":
        return precision  # BF16 weights: BF16 activations and KV everywhere
    if isl in HARNESS_LENGTHS and osl in HARNESS_LENGTHS \
            and any(backend == b and preset.startswith(p) for b, p in FP8_KV_LAUNCHES):
        return "fp8"
    if not _modelopt_fp8(model_path):
        return "bf16"
    if backend == "vllm":
        v = _version(version)
        return "fp8" if v is not None and v >= (0, 13) else "bf16"
    return "fp8"
