"""The server flags the measuring harness launched each runtime with, where its scripts say.

The sample's rows at InferenceX's sequence lengths (ISL and OSL each 1024 or 8192: its ``1k1k``,
``1k8k`` and ``8k1k`` configs) come from SemiAnalysis InferenceX's nightly runs, which launch every
runtime with flags of their own rather than the runtime's defaults. Where a flag changes what the
simulator's runtime profile models, the row is simulated with it; each entry names the script, under
``benchmarks/single_node/`` of ``github.com/SemiAnalysisAI/InferenceX``, that sets it:

- SGLang, DeepSeek-R1/V3 (``dsr1_fp8_h200.sh``): ``--chunked-prefill-size 32768``
  (``max_num_batched_tokens``), ``--cuda-graph-max-bs`` 512 at 1k/1k and 256 otherwise
  (``graph_max_tokens``), ``--mem-fraction-static 0.82``.
- TensorRT-LLM, DeepSeek-R1/V3 (``dsr1_fp8_h200_trt.sh``): ``max_num_tokens`` = max(8192, CONC + ISL + 64
  rounded up to 64), ``cuda_graph_config.max_batch_size: 128``, ``free_gpu_memory_fraction: 0.75``, and with
  attention DP ``attention_dp_config: {enable_balance: true, timeout_iters: 60, batching_wait_iters: 0}``.
- vLLM, gpt-oss-120b (``gptoss_fp4_h200.sh``): ``--max-num-batched-tokens 8192``,
  ``max-cudagraph-capture-size: 2048``, ``--gpu-memory-utilization 0.9``, and ``export
  VLLM_MXFP4_USE_MARLIN=1``: the MXFP4 experts on Marlin's kernels, held padded to its tiles
  (:mod:`simcore.serving.deployment.moe_kernels`, which prices every vLLM MXFP4 row so).
- TensorRT-LLM, gpt-oss-120b (``gptoss_fp4_h200_trt.sh``): ``--max_num_tokens 20000``,
  ``free_gpu_memory_fraction: 0.85`` (CUDA graphs up to the concurrency: every decode batch), and
  ``moe_config.backend: TRITON``, which is what TensorRT-LLM runs MXFP4 experts with on any Hopper GPU
  whatever the launch, so it is not a flag here but the runtime's kernel choice (:mod:`simcore.serving.deployment.moe_kernels`,
  applied to every such row).
- SGLang, Qwen3.5-397B-A17B (``qwen3.5_fp8_h200.sh``): ``--chunked-prefill-size 16384``,
  ``--mem-fraction-static 0.8`` (CUDA graphs up to the concurrency), and ``--mamba-ssm-dtype bfloat16``:
  the Gated DeltaNet recurrent state in BF16, not the config's FP32, a model field the launch sets
  (:func:`launch_model_fields`; half the state's memory and its decode traffic, which the delta rule's
  timed kernels show is most of that kernel's time).
- TensorRT-LLM, Llama-3.3-70B (the sample's ``meta-llama/Llama-3.1-70B`` rows; ``llama70b_fp8_h200_trt``
  launcher): ``--max_num_tokens $MAX_MODEL_LEN`` (the config's ``max-model-len``, ISL + OSL + 200: 2248 at
  1k/1k), ``cuda_graph_config.max_batch_size: 1024``, and at 1k/1k below TP 8 batch waiting:
  ``batch_wait_timeout_iters: 20``, ``batch_wait_max_tokens_ratio: 0.9`` (the script: "For 1k/1k, use
  batch_wait_max_tokens_ratio and batch_wait_timeout_iters will improve the performance"). A later copy
  of the launcher passes ``--max_num_tokens 16384``; which copy ran a row is not recorded. These rows are
  fit rows, and the choice was made on them (in sample, 4 requests per client): on their 24 1k/1k rows
  the ``MAX_MODEL_LEN`` copy puts 16 within 15% of the measured TTFT, the 16384 copy 7.
- vLLM, Llama-3.3-70B and gpt-oss-120b (``70b_fp8_h200_slurm.sh``, ``gptoss_fp4_h200.sh``): ``async-scheduling:
  true`` in the server's ``config.yaml``, on the sample's unversioned runs too. Not applied: simulated as
  overlapped (profile ``vllm``), the 60 Llama-70B fit rows' TPOT misses by a median 0.27 (``|log|``) at any
  host time up to 6 ms, against 0.09 as ``vllm-sync``; the per-step time the host fit finds is not hidden
  in these runs, so these rows keep the version rule of ``mapping.runtime_of`` (an open question: validation/reports/serving/history.md).
- SGLang, GLM-5 (``glm5_fp8_h200.sh``): ``--mem-fraction-static 0.85``, and the client sends 5 requests per
  client (``num_prompts=$((CONC * 5))``) where the other scripts send 10 (:func:`requests_per_client`).
- vLLM, Kimi-K2.5 and MiniMax-M2.5 (``kimik2.5_int4_h200.sh``, ``minimaxm2.5_fp8_h200.sh``):
  ``--gpu-memory-utilization 0.95``; the token budget is vLLM's default (a later MiniMax script raises
  it with the concurrency; which copy ran a row is not recorded, so the default stays).

The entries above are InferenceX's H200 scripts. An H100 row (``system`` ``h100_sxm``) ran that system's
own script (its runners, ``runners/launch_h100-*.sh``, start ``${model}_${precision}_h100.sh``), and
InferenceX's configs (``.github/configs/nvidia-master.yaml``, the older ``master.yaml``) run three
single-node H100 benchmarks, all on vLLM:

- gpt-oss-120b (``gptoss_fp4_h100.sh``): the H200 script's token budget, capture size, memory share and
  ``VLLM_MXFP4_USE_MARLIN=1``.
- MiniMax-M2.5 (``minimaxm2.5_fp8_h100.sh``): ``--gpu-memory-utilization 0.90``, where the H200 script
  passes 0.95 (its ``--max-num-seqs 256`` is above the sweep's 64 clients; its ``cudagraph_mode:
  PIECEWISE``, attention outside the graphs, is not modelled).
- Llama-3.3-70B (``70b_fp8_h100_slurm.sh``): nothing this module models, as on H200.

InferenceX has no single-node H100 script for the others (DeepSeek-R1 on SGLang or TensorRT-LLM, gpt-oss and
Llama-70B on TensorRT-LLM, Kimi-K2.5, GLM-5, Qwen3.5's nightly sweep); its H100 DeepSeek runs are multi-node
Dynamo deployments whose recipes live in another repository. So such a row, like a row of any other system,
keeps the profiles' defaults: a flag applies only where the script that ran the row sets it.

Rows at other lengths (aiconfigurator's own sweeps: ISL 1000-8000, OSL 100-2000) keep the profiles'
defaults. These are launch settings read from the harness, not fitted values.

The KV cache's element type (:func:`kv_cache_precision`) is a flag too, where the harness's script sets one
(rows at :data:`HARNESS_LENGTHS`):

- FP8: TensorRT-LLM DeepSeek-R1/V3 (``dsr1_fp8_h200_trt.sh``: ``kv_cache_config: dtype: fp8``);
  Llama-3.3-70B on vLLM (``70b_fp8_h200_slurm.sh``: ``kv-cache-dtype: fp8``) and on TensorRT-LLM
  (``70b_fp8_h200_trt_slurm.sh``: ``dtype: fp8``); Qwen3.5 on SGLang (``qwen3.5_fp8_h200.sh``:
  ``--kv-cache-dtype fp8_e4m3``).
- No flag (``auto``: the runtime's own choice by its version, :mod:`simcore.serving.deployment.kv_dtype`):
  DeepSeek-R1 on SGLang (``dsr1_fp8_h200.sh``), gpt-oss on vLLM and on TensorRT-LLM
  (``gptoss_fp4_h200*.sh``: ``dtype: auto``), Kimi-K2.5 (``kimik2.5_int4_h200.sh``). MiniMax-M2.5
  (``minimaxm2.5_fp8_h200.sh``): one copy of the script passes ``--kv-cache-dtype fp8``, another none;
  which ran a row is not recorded, so, as for its token budget, the default stays.

Rows with 4-bit experts (gpt-oss, Kimi) already run BF16 everywhere on Hopper (:mod:`.mapping`).

What each flag does to a simulated step, and the ``shard-sim workload=serving`` field that sets it, is
:mod:`simcore.serving.deployment`'s; this module only says which flags the harness passed.
"""

from __future__ import annotations

from simcore.models.quantization import round_up
from simcore.serving.deployment import parse_version, runtime_kv_dtype

__all__ = ["launch_flags", "launch_model_fields", "deepseek_trtllm_mtp_flags", "requests_per_client", "HARNESS_LENGTHS",
           "HARNESS_SYSTEMS", "REQUESTS_PER_CLIENT", "kv_cache_precision", "FP8_KV_LAUNCHES"]

#: InferenceX's sequence lengths: a row whose ISL and OSL are both among them is one of its runs
HARNESS_LENGTHS = (1024, 8192)
#: the systems whose InferenceX scripts this module reads (module doc): H200, then H100
HARNESS_SYSTEMS = ("h200_sxm", "h100_sxm")
#: gptoss_fp4_h200.sh and gptoss_fp4_h100.sh alike: ``--max-num-batched-tokens 8192``,
#: ``max-cudagraph-capture-size: 2048``, ``--gpu-memory-utilization 0.9``
_GPT_OSS_VLLM = {"max_num_batched_tokens": 8192, "graph_max_tokens": 2048, "mem_fraction": 0.90}
#: requests each closed-loop client sends: InferenceX's ``--num-prompts`` is 10 x the concurrency
REQUESTS_PER_CLIENT = 10


def _harness_run(isl: int, osl: int, system: str) -> bool:
    """Whether a row at these lengths on this system is one of the InferenceX runs this module reads."""
    return isl in HARNESS_LENGTHS and osl in HARNESS_LENGTHS and system in HARNESS_SYSTEMS


def launch_flags(backend: str, preset: str, isl: int, osl: int, concurrency: int, tp: int = 1,
                 system: str = "h200_sxm") -> dict:
    """Runtime-profile fields the harness's launch sets for this row (empty: the profile's defaults);
    ``tp``: the row's tensor-parallel degree; ``system``: the row's, whose own script ran it (module doc)."""
    if not _harness_run(isl, osl, system):
        return {}
    if system == "h100_sxm":
        return _h100_flags(backend, preset)
    deepseek = preset.startswith("deepseek-")
    if backend == "sglang" and deepseek:
        return {"max_num_batched_tokens": 32768, "graph_max_tokens": 512 if (isl, osl) == (1024, 1024) else 256,
                "mem_fraction": 0.82}
    if backend == "trtllm" and deepseek:
        return {"max_num_batched_tokens": max(8192, round_up(concurrency + isl + 64, 64)), "graph_max_tokens": 128,
                "mem_fraction": 0.75, "attention_dp_balance": True, "attention_dp_timeout_iters": 60,
                "attention_dp_batching_wait_iters": 0}
    if backend == "vllm" and preset.startswith("gpt-oss"):
        return dict(_GPT_OSS_VLLM)
    if backend == "trtllm" and preset.startswith("gpt-oss"):
        return {"max_num_batched_tokens": 20000, "graph_max_tokens": max(concurrency, 1), "mem_fraction": 0.85}
    if backend == "sglang" and preset.startswith("qwen3.5"):
        return {"max_num_batched_tokens": 16384, "graph_max_tokens": max(concurrency, 1), "mem_fraction": 0.80}
    if backend == "trtllm" and preset == "llama-3.1-70b":
        flags = {"max_num_batched_tokens": isl + osl + 200, "graph_max_tokens": 1024}
        if (isl, osl) == (1024, 1024) and tp < 8:
            flags |= {"batch_wait_timeout_iters": 20, "batch_wait_max_tokens_ratio": 0.9}
        return flags
    if backend == "vllm" and preset.startswith(("kimi", "minimax")):
        return {"mem_fraction": 0.95}
    if backend == "sglang" and preset.startswith("glm-5"):
        return {"mem_fraction": 0.85}
    return {}


def _h100_flags(backend: str, preset: str) -> dict:
    """What InferenceX's single-node H100 scripts set (module doc); nothing for a runtime and model it has
    no H100 script for."""
    if backend == "vllm" and preset.startswith("gpt-oss"):
        return dict(_GPT_OSS_VLLM)
    if backend == "vllm" and preset.startswith("minimax"):
        return {"mem_fraction": 0.90}
    return {}


def launch_model_fields(backend: str, preset: str, isl: int, osl: int, system: str = "h200_sxm") -> dict:
    """Model fields (``ModelSpec``) the harness's launch sets for this row, beside the runtime's: the
    serving engine's dtype for a state the config gives another (empty: the config's). H200 scripts only:
    no H100 script runs Qwen3.5's sweep (module doc)."""
    if not _harness_run(isl, osl, system) or system != "h200_sxm":
        return {}
    if backend == "sglang" and preset.startswith("qwen3.5"):
        return {"linear_state_bytes": 2}  # --mamba-ssm-dtype bfloat16
    return {}


def deepseek_trtllm_mtp_flags(concurrency: int, isl: int, tp: int, attention_dp: bool) -> dict:
    """What InferenceX's MTP launch of DeepSeek-R1 on TensorRT-LLM sets beside :func:`launch_flags`
    (``dsr1_fp8_h200_trt_mtp.sh``): ``speculative_config`` ``decoding_type: MTP`` with 3 draft tokens
    (``num_nextn_predict_layers``) without attention DP and 1 with, and ``max_num_tokens`` =
    ``(MTP + 1) x max_batch_size + ISL + 64`` rounded up to 64, ``max_batch_size`` being the concurrency per
    attention-DP rank. A row does not record which of the two launches (with or without MTP) ran it, so
    the study simulates its rows without, and ``python -m validation.studies.serving.speculative`` shows both."""
    mtp = 1 if attention_dp else 3
    per_rank = concurrency // tp if attention_dp else concurrency
    return {"spec_tokens": mtp, "max_num_batched_tokens": round_up((mtp + 1) * per_rank + isl + 64, 64)}


def requests_per_client(backend: str, preset: str, isl: int, osl: int, system: str = "h200_sxm") -> int:
    """Requests each client of the row's run sends (module doc): :data:`REQUESTS_PER_CLIENT`, 5 for
    InferenceX's GLM-5 runs on SGLang (``glm5_fp8_h200.sh``; no H100 script runs GLM-5)."""
    if _harness_run(isl, osl, system) and system == "h200_sxm" and backend == "sglang" and preset.startswith("glm-5"):
        return 5
    return REQUESTS_PER_CLIENT



#: (backend, preset prefix) whose InferenceX launch forces an FP8 KV cache (module doc)
FP8_KV_LAUNCHES = (("trtllm", "deepseek-"), ("vllm", "llama-3.1-70b"), ("trtllm", "llama-3.1-70b"),
                   ("sglang", "qwen3.5"))


def kv_cache_precision(backend: str, version: str, model_path: str, preset: str, precision: str,
                       isl: int, osl: int) -> str:
    """``bf16`` or ``fp8``: the KV cache's element type of a row (module doc): FP8 where the harness's
    launch passes the flag, else the runtime's default at the row's version
    (:func:`simcore.serving.deployment.runtime_kv_dtype`); ``precision`` is the mapped weights'
    (``Workload.precision``)."""
    if precision == "fp8" and isl in HARNESS_LENGTHS and osl in HARNESS_LENGTHS \
            and any(backend == b and preset.startswith(p) for b, p in FP8_KV_LAUNCHES):
        return "fp8"
    return runtime_kv_dtype(backend, parse_version(version), model_path, precision)
