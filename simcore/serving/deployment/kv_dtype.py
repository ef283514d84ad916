"""The KV cache's element type a runtime picks by default (``Workload.kv_precision``), by its version.

It is the runtime's choice, not the weights': an FP8 checkpoint's KV cache is FP8 only where a flag
(vLLM's and SGLang's ``--kv-cache-dtype fp8``, TensorRT-LLM's ``kv_cache_config.dtype: fp8``; the
``serving.kv_dtype`` of ``shard-sim workload=serving``) or the checkpoint asks for it. Getting it wrong
halves or doubles decode attention's HBM traffic and the KV cache's capacity. Without a flag (``auto``):

- vLLM and SGLang store KV in the model's activation dtype (BF16; vLLM's ``kv_cache_dtype_str_to_dtype``,
  SGLang's ``ModelRunner.configure_kv_cache_dtype``), except for a ModelOpt checkpoint (NVIDIA's
  ``nvidia/*-FP8`` ids) that declares FP8 KV (``kv_cache_quant_algo``): SGLang follows it, and vLLM from
  v0.13 (vllm-project/vllm#30785, ``resolve_kv_cache_dtype_string``; v0.12 and earlier, or no version
  known: model dtype). Block-FP8 checkpoints (DeepSeek, Qwen3, MiniMax: ``quant_method: fp8``) declare no
  KV type: BF16.
- TensorRT-LLM takes the checkpoint's ``kv_cache_quant_algo`` (``validate_and_set_kv_cache_quant``,
  "Using checkpoint KV quantization"): FP8 for a ModelOpt FP8 checkpoint, BF16 for the rest.

ModelOpt's FP8 export quantizes the KV cache by default (``hf_ptq.py --kv_cache_qformat fp8``); that
NVIDIA's published ``*-FP8`` checkpoints declare it is assumed, not read here (their
``hf_quant_config.json`` is not shipped).

Which flags a measuring harness passed is the serving study's to say
(``validation.studies.serving.launch.kv_cache_precision``).
"""

from __future__ import annotations

__all__ = ["runtime_kv_dtype", "modelopt_fp8"]


def modelopt_fp8(model_id: str) -> bool:
    """An NVIDIA ModelOpt FP8 checkpoint (module doc: assumed to declare FP8 KV)."""
    org, _, name = model_id.strip().partition("/")
    return org.lower() == "nvidia" and "fp8" in name.lower()


def runtime_kv_dtype(scheduler: str, version: tuple[int, ...] | None, model_id: str, precision: str) -> str:
    """``bf16`` or ``fp8``: the KV cache's element type runtime ``scheduler`` (``vllm`` | ``sglang`` |
    ``trtllm``) at ``version`` (``None``: not known) picks without a flag for checkpoint ``model_id`` (its
    published id) whose weights are at ``precision`` (``Workload.precision``; module doc)."""
    if precision != "fp8":
        return precision  # BF16 weights: BF16 activations and KV everywhere
    if not modelopt_fp8(model_id):
        return "bf16"
    if scheduler == "vllm":
        return "fp8" if version is not None and version[:2] >= (0, 13) else "bf16"
    return "fp8"
