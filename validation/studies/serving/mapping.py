"""One row of a measured-serving CSV (aiconfigurator's ``silicon_sample.csv`` schema) as a simulation.

The mapping, column by column:

- ``model_path`` -> a model preset through :func:`simcore.models.preset_for` (published ids, their
  Instruct / FP8 variants, ``moonshotai/Kimi-K2.5`` -> ``kimi-k2``). A model with no preset, or of an
  architecture the cost model refuses (non-Gated-DeltaNet linear attention: MiniMax-M1), is skipped,
  with why. Qwen3.5 (``Qwen/Qwen3.5-397B-A17B``, ``-FP8``) maps to ``qwen3.5-397b-a17b``, its Gated
  DeltaNet layers priced by :mod:`simcore.models.linear_attention`; GLM-5 (``zhipuai/GLM-5``) to ``glm-5``, its
  DeepSeek sparse attention priced by :mod:`simcore.models.sparse_attention`.
- ``backend`` -> runtime profile (``vllm`` | ``sglang`` | ``trtllm``; vLLM before v0.14 or unversioned ->
  ``vllm-sync``, see :func:`runtime_of`); ``system`` -> GPU (``h100_sxm``,
  ``h200_sxm``, ``b200_sxm``).
- ``precision`` -> weights and GEMMs (the KV cache's type is the runtime's choice: :mod:`.kv_dtype`):
  ``fp8`` / ``bf16`` as they are; ``fp4`` / ``int4`` (gpt-oss MXFP4,
  Kimi-K2 INT4 experts) are weight-only 4-bit experts: each expert weight half a byte plus its
  block's scale, in the checkpoint's format (:mod:`simcore.models.quantization`: MXFP4 0.53125 bytes, group-32 INT4
  0.5625); on Hopper (no 4-bit tensor-core math) every GEMM runs in BF16 and the other weights are BF16
  as those checkpoints ship them, elsewhere FP8. vLLM holds MXFP4 experts on Hopper padded to Marlin's
  tiles (:func:`simcore.serving.deployment.vllm_mxfp4_padding`).
- Layout per pool: ``tp_size`` is the attention TP degree, ``attention_dp_size`` the data-parallel
  attention groups (our ``ep``: experts split that many ways). Experts expert-parallel beyond those
  groups run inside each TP group (the pool's ``moe_ep`` = ``moe_ep_size / attention_dp_size``, experts
  tensor-parallel over the rest: ``moe_tp_size``): each GPU holds and runs its own whole experts on the
  group's replicated tokens, reduced by the all-reduce TP uses (:class:`simcore.serving.Pool`). Every
  MoE row is simulated with each step's token copies drawn multinomially over equally popular experts
  (``RoutingConfig(sampled=True)``): an expert-parallel MoE layer waits for its busiest GPU (the binomial
  maximum, :func:`simcore.moe.expected_max_loads`), where expert TP splits every expert evenly. A layout
  whose attention GPUs (tp x dp) differ from its expert GPUs (moe_tp x moe_ep) is skipped, except a vLLM
  row with a blank ``attention_dp_size`` whose expert GPUs are a multiple k of ``tp_size``: vLLM's MoE
  layers run over all data-parallel x tensor-parallel ranks (its ``FusedMoEParallelConfig``), so the row
  is ``--data-parallel-size k`` (Qwen3-235B-FP8 at tp1 moe_tp2 cannot fit one H200 otherwise). A row
  whose ``tp_size`` exceeds one node's 8 GPUs and equals ``moe_tp_size x moe_ep_size`` with both equal
  (tp 64 = 8 x 8: DeepSeek-R1/V3 on TensorRT-LLM, Qwen3.5 on SGLang; tp 16 = 4 x 4: gpt-oss on
  TensorRT-LLM) records the product of the launch's two flags as its TP degree: InferenceX's single-node
  configs launch these as ``{tp: 8, ep: 8}`` / ``{tp: 4, ep: 4}`` (``.github/configs/nvidia-master.yaml``,
  entries ``dsr1-fp8-h200-trt``, ``qwen3.5-fp8-h200-sglang``, ``gptoss-fp4-h200-trt``), i.e.
  ``trtllm-serve --tp_size T --ep_size T`` / ``sglang --tp T --expert-parallel-size T`` on T GPUs:
  attention TP T, experts EP T (MoE TP = tp / ep = 1). Such a row is mapped to that deployment; one
  whose two expert degrees differ stays skipped (its launch is not known). Where that deployment cannot
  hold the model's weights with room for a KV cache under the row's runtime (DeepSeek-V3 on 4 H100s, for
  a tp 16 = 4 x 4 row), the row is read as written: ``tp_size`` GPUs over as many nodes, attention TP over
  all of them, experts ``moe_tp x moe_ep``, as a 16-GPU H100 deployment would record it. The same launch with
  attention data parallelism on (``dp-attn: true``: DeepSeek on TensorRT-LLM at 8k/1k) is recorded as
  tp 1, ``attention_dp_size`` 64 = 8 x 8, and maps to attention DP 8 with experts EP 8 on 8 GPUs.
- ``batch_size`` (``prefill_`` / ``decode_`` for disaggregated rows) -> ``max_num_seqs`` per worker:
  the sample records it per attention-DP rank for every backend (TensorRT-LLM's ``max_batch_size`` and
  each vLLM DP engine's ``max_num_seqs`` are per rank; SGLang's DP-attention rows record the per-rank
  share of ``--max-running-requests``: decode batch 8 / 16 / 32 on 8 DP ranks at 64 / 128 / 256
  clients), so times ``attention_dp_size``; blank -> the concurrency. ``*_num_workers`` (blank = 1) -> workers per pool.
- ``silicon_concurrency=N`` in ``silicon_data_source`` -> N closed-loop clients. An aggregated row
  without it whose ``batch_size`` is given runs as many clients as its engine runs sequences at once
  (``batch_size`` x attention-DP ranks), noted ``concurrency_from_batch``; a disaggregated row without it
  is skipped (its worker counts' reason first, where they are missing too).
- ``precision`` blank (with ``gemm_quant_mode`` blank): the checkpoint's own weights (:func:`row_precision`:
  ``fp8`` for an id naming an FP8 checkpoint, ``-FP8``, ``FP8-dynamic``; a 4-bit checkpoint's format;
  else the preset's ``config.json`` ``torch_dtype``, BF16 / FP16 read as 16-bit). ``gemm_quant_mode`` and
  (MoE models) ``moe_quant_mode`` must be a mode of that precision (:data:`_GEMM_MODES`, :data:`_MOE_MODES`);
  a precision, quantization mode or vLLM ``backend_version`` the model does not know skips the row with
  the column and its value, never read as another.
- The measuring harness's launch flags, where its scripts set them (:mod:`.launch`) -> ``launch``:
  runtime-profile fields the row is simulated with; the MoE kernels the runtime runs the row's experts
  with on its GPU where they are not the profile's (:mod:`simcore.serving.deployment.moe_kernels`: TensorRT-LLM's Triton MoE for
  MXFP4 experts on Hopper); and what the row's runtime version does by default where that differs
  between versions of one profile (:func:`version_fields`: vLLM v0.12-v0.14's DeepGEMM MoE path for FP8
  experts, ``moe_padded_rows``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.hardware.gpus import get_gpu
from simcore.models import ModelConfigError, get_model, preset_for
from simcore.models.quantization import FORMAT_BYTES, expert_format
from simcore.moe import RoutingConfig
from simcore.serving import Pool, ServingPlan, get_runtime, runtime_strategy
from simcore.serving.deployment import (
    moe_kernel_fields,
    parse_version,
    runtime_profile_name,
    version_defaults,
    vllm_mxfp4_padding,
)
from simcore.serving.kvcache import kv_capacity_tokens
from simcore.workload import Workload
from validation.studies.serving.launch import (
    REQUESTS_PER_CLIENT,
    kv_cache_precision,
    launch_flags,
    launch_model_fields,
    requests_per_client,
)

__all__ = ["RowCase", "map_row", "SYSTEMS", "model_preset", "runtime_of", "row_precision", "row_workload",
           "version_fields"]

SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
NODE_GPUS = 8  # GPUs in one NVLink domain of every system above (HGX H100 / H200 / B200)
_FOUR_BIT = ("fp4", "int4", "nvfp4", "mxfp4", "w4a16", "w4a8")


@dataclass
class RowCase:
    """A row ready to simulate, or ``skip`` with why not."""

    row: dict
    skip: str = ""
    model: str = ""
    ctx: CostContext | None = None
    plan: ServingPlan | None = None
    concurrency: int = 0
    isl: int = 0
    osl: int = 0
    runtime: str = ""
    launch: dict = field(default_factory=dict)
    requests_per_client: int = REQUESTS_PER_CLIENT
    #: what the mapping read in a way the row did not state (``concurrency_from_batch``: :func:`_clients_from_batch`)
    notes: tuple[str, ...] = ()


def model_preset(model_path: str) -> str | None | ModelConfigError:
    """The preset of a published id (:func:`simcore.models.preset_for`), ``None`` if there is none,
    or the error naming an architecture the cost model refuses."""
    try:
        path = model_path.strip()
        name = path.split("/")[-1]
        return preset_for(path) or preset_for(name) or preset_for(re.sub(r"-fp8$", "", name, flags=re.I))
    except ModelConfigError as exc:
        return exc


def runtime_of(row: dict) -> str:
    """The runtime profile of a row: its ``backend`` at its ``backend_version``
    (:func:`simcore.serving.deployment.runtime_profile_name`: vLLM before v0.14 is ``vllm-sync``), a vLLM
    row with no version (the sample's older, unversioned runs) ``vllm-sync`` too."""
    backend = row.get("backend", "").strip()
    version = parse_version(row.get("backend_version"))
    return "vllm-sync" if backend == "vllm" and version is None else runtime_profile_name(backend, version)


def version_fields(row: dict, moe: bool, precision: str) -> dict:
    """Runtime-profile fields a row's runtime version sets by default (empty: the profile's;
    :func:`simcore.serving.deployment.version_defaults`: vLLM v0.12-v0.14's DeepGEMM MoE path), with the
    MoE TP degree the row records (its decode pool's for a disaggregated row)."""
    prefix = "" if (row.get("mode") or "").strip() != "disagg" else "decode_"
    ep = _int(row, prefix + "moe_ep_size", 1) or 1  # expert parallelism on: vLLM's MoE TP degree is 1
    moe_tp = 1 if ep > 1 else (_int(row, prefix + "moe_tp_size", 0) or _int(row, prefix + "tp_size", 1) or 1)
    return version_defaults((row.get("backend") or "").strip(), parse_version(row.get("backend_version")), moe,
                            precision, moe_tp)


class RowError(ValueError):
    """A field of one row that cannot be read; the row is skipped with this one-line reason."""


def _number(row: dict, key: str) -> float:
    """A positive number in column ``key`` (``1024`` or ``1024.0``), else :class:`RowError` naming it."""
    text = (row.get(key) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"{key}: {text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise RowError(f"{key}: must be a positive number, got {text!r}")
    return value


def _int(row: dict, key: str, default: int | None = None) -> int | None:
    """A positive integer in column ``key``; blank gives ``default``."""
    if not (row.get(key) or "").strip():
        return default
    value = _number(row, key)
    if value != int(value):
        raise RowError(f"{key}: must be a whole number, got {row.get(key)!r}")
    return int(value)


def _pool(row: dict, prefix: str, concurrency: int, moe: bool, compact: bool = True) -> Pool | str:
    """One pool's layout. ``batch_size`` is per attention-DP rank (module doc), so a worker runs
    ``batch_size x attention_dp_size`` sequences. ``compact``: read a ``tp_size`` (or ``attention_dp_size``)
    above one node that equals ``moe_tp_size x moe_ep_size``, both equal, as InferenceX's ``--tp T --ep T``
    launch on T GPUs (module doc); ``False``: as written, that many GPUs."""
    tp = _int(row, f"{prefix}tp_size", 1)
    pp = _int(row, f"{prefix}pp_size", 1)
    dp = recorded_dp = _int(row, f"{prefix}attention_dp_size", 1)
    moe_tp = _int(row, f"{prefix}moe_tp_size", 1)
    moe_ep = _int(row, f"{prefix}moe_ep_size", 1)
    vllm = row.get("backend", "").strip() == "vllm"
    if moe and vllm and not (row.get(f"{prefix}attention_dp_size") or "").strip() \
            and moe_tp * moe_ep > tp and (moe_tp * moe_ep) % tp == 0:
        dp = moe_tp * moe_ep // tp  # vLLM's MoE layers span all data-parallel x tensor-parallel ranks
    if compact and tp > NODE_GPUS and moe_tp == moe_ep > 1 and tp == moe_tp * moe_ep:
        tp, moe_tp = moe_ep, 1  # `--tp T --ep T` recorded as tp T x T (module doc)
    if compact and dp > NODE_GPUS and tp == 1 and moe_tp == moe_ep > 1 and dp == moe_tp * moe_ep:
        dp, moe_tp = moe_ep, 1  # the same launch with attention DP on (`dp-attn: true`) (module doc)
    if moe and tp * dp != moe_tp * moe_ep:
        return f"layout: attention on tp{tp} x dp{dp} GPUs but experts on moe_tp{moe_tp} x moe_ep{moe_ep}"
    if compact and tp > NODE_GPUS and moe_tp > 1 and moe_ep > 1:
        return (f"layout: tp_size {tp} spans {tp // NODE_GPUS} {NODE_GPUS}-GPU nodes and equals moe_tp {moe_tp} x "
                f"moe_ep {moe_ep} (unequal): a product of the expert degrees recorded as the TP degree, whose "
                f"launch is not known")
    workers = _int(row, f"{prefix}num_workers", 1) if prefix else 1
    seqs = _int(row, f"{prefix}batch_size", concurrency)
    seqs *= max(dp, recorded_dp)  # per recorded rank: 64 = 8 x 8 ranks of batch b run 64 b sequences
    # The experts' EP degree beyond the attention-DP groups runs inside each TP group (module doc). An EP
    # degree below the DP groups' count (experts EP x TP across them) has no such reading: its experts stay
    # split over the DP groups, as the strategy has them.
    inner = moe_ep // dp if moe and moe_ep > dp and moe_ep % dp == 0 and tp % (moe_ep // dp) == 0 else 1
    return Pool(runtime_strategy(tp=tp, ep=dp, pp=pp), workers=workers, max_num_seqs=max(seqs, 1), moe_ep=inner)


def _expert_format(row: dict, model) -> str | None:
    """The routed experts' 4-bit format of an MoE row with 4-bit weights (:mod:`simcore.models.quantization`), else None."""
    p = row_precision(row, model)
    if p not in _FOUR_BIT or not model.is_moe:
        return None
    return expert_format(row.get("model_path") or "", row.get("moe_quant_mode") or p)


#: 16-bit weight names (aiconfigurator writes ``float16``; Hopper runs FP16 at BF16's rate)
_SIXTEEN_BIT = ("bf16", "fp16", "float16", "bfloat16")
#: a published id naming an FP8 checkpoint (``Qwen3-235B-A22B-FP8``, ``Llama-3.3-70B-Instruct-FP8-dynamic``)
_FP8_ID = re.compile(r"(^|[-_.])fp8([-_.]|$)", re.IGNORECASE)
#: ModelSpec.checkpoint_dtype -> the precision label a row with a blank ``precision`` is read as (FP32
#: checkpoints are served in 16 bits: the runtimes' ``dtype auto``)
_CHECKPOINT_LABEL = {"bf16": "bf16", "fp16": "bf16", "fp32": "bf16", "fp8": "fp8", "mxfp4": "mxfp4",
                     "nvfp4": "nvfp4", "int4_g32": "int4", "int4_g128": "int4"}
#: ``gemm_quant_mode`` / ``moe_quant_mode`` values (aiconfigurator's ``GEMMQuantMode`` / ``MoEQuantMode`` names)
#: read as each kind of weights the model prices; blank: the precision's own. Others (``int8_wo``, ``sq``,
#: ``w4afp8``, ...) are skipped with their name: the model prices none of them. A 4-bit row is priced by its
#: checkpoint's expert format and its GPU (BF16 GEMMs on Hopper, else FP8: :func:`row_workload`), not by
#: these labels, so any mode named here is read for it.
_FOUR_BIT_MODES = ("int4_wo", "nvfp4", "mxfp4", "w4a16_mxfp4")
_GEMM_MODES = {"16-bit": ("", "float16", "bfloat16", "bf16", "fp16"),
               "fp8": ("", "fp8", "fp8_block", "fp8_static", "fp8_ootb")}
_MOE_MODES = {"16-bit": ("", "float16", "bfloat16", "bf16", "fp16"), "fp8": ("", "fp8", "fp8_block")}
for _modes in (_GEMM_MODES, _MOE_MODES):
    _modes["4-bit"] = tuple(dict.fromkeys(m for known in list(_modes.values()) for m in known)) + _FOUR_BIT_MODES


def row_precision(row: dict, model) -> str:
    """The row's ``precision`` (lower case), or where blank the checkpoint's own weight type: a 4-bit
    checkpoint the id names (:data:`simcore.models.quantization.CHECKPOINT_FORMAT`), ``fp8`` for an id that
    names an FP8 checkpoint, else the preset's ``config.json`` (``ModelSpec.checkpoint_dtype``); ``""`` where
    none of them says."""
    p = (row.get("precision") or "").strip().lower()
    if p:
        return p
    # imported here: the module's import lines are another change's
    from simcore.models.quantization import CHECKPOINT_FORMAT

    path = (row.get("model_path") or "").strip()
    if path in CHECKPOINT_FORMAT:
        return _CHECKPOINT_LABEL[CHECKPOINT_FORMAT[path]]
    if _FP8_ID.search(path.split("/")[-1]):
        return "fp8"
    return _CHECKPOINT_LABEL.get(model.checkpoint_dtype, "")


def _quant_modes(row: dict, model, p: str) -> str:
    """Why the row's ``gemm_quant_mode`` or (MoE models) ``moe_quant_mode`` is not what weights of precision
    ``p`` run, or ``""``."""
    kind = "16-bit" if p in _SIXTEEN_BIT else "fp8" if p == "fp8" else "4-bit"
    columns = (("gemm_quant_mode", _GEMM_MODES),) + ((("moe_quant_mode", _MOE_MODES),) if model.is_moe else ())
    for column, known in columns:
        mode = (row.get(column) or "").strip().lower()
        if mode not in known[kind]:
            read = "" if (row.get("precision") or "").strip() else " (precision blank: the checkpoint's own)"
            return (f"{column}: {mode!r} is not modelled with {p} weights{read}; read: "
                    f"{', '.join(m for m in known[kind] if m)}")
    return ""


def row_workload(row: dict, model, gpu: str) -> Workload | str:
    """The workload of a row's ``precision`` (blank: the checkpoint's own, :func:`row_precision`; for 4-bit
    experts also ``model_path`` and ``moe_quant_mode``) on ``gpu``, or a one-line reason it is not modelled,
    naming the column and its value: a precision, or a ``gemm_quant_mode`` / ``moe_quant_mode`` the model
    does not price with it."""
    p = row_precision(row, model)
    if not p:
        return (f"precision: blank, and neither the id {row.get('model_path')!r} nor preset {model.name}'s "
                "config.json states the checkpoint's weight type")
    if p not in ("fp8", *_SIXTEEN_BIT, *_FOUR_BIT):
        return f"precision: {p!r} is not modelled"
    why = _quant_modes(row, model, p)
    if why:
        return why
    if p in ("fp8", *_SIXTEEN_BIT):
        return Workload(precision="fp8" if p == "fp8" else "bf16")
    if not model.is_moe:
        return f"precision: {p} weights on a dense model are not modelled"
    four_bit = FORMAT_BYTES[_expert_format(row, model)]
    if get_gpu(gpu).arch == "hopper":
        # Hopper has no 4-bit tensor-core math: the runtimes run these experts weight-only (W4A16:
        # Marlin, Triton matmul_ogs), dequantized into BF16 GEMMs; and both 4-bit checkpoints here
        # ship attention and dense weights in BF16 (gpt-oss model card; Kimi-K2's compressed-tensors
        # config quantizes the routed experts only). Each expert weight is 4 bits plus its block's
        # scale, in the checkpoint's format (.weight_format).
        return Workload(precision="bf16", expert_weight_bytes=four_bit)
    return Workload(precision="fp8", expert_weight_bytes=four_bit)


BACKENDS = ("vllm", "sglang", "trtllm")
MODES = ("agg", "disagg")
_NO_WORKERS = "layout: a disaggregated row without worker counts (the pools' sizes are unknown)"


def _unknown_version(row: dict) -> str:
    """Why a row's ``backend_version`` is not one the mapping knows, or ``""``: a vLLM row's release sets its
    host step (overlapped from v0.14) and MoE path (:func:`runtime_of`, :func:`version_fields`), so a label
    that names no release (``nightly``) is skipped rather than read as one; blank is the sample's older,
    unversioned runs. SGLang's and TensorRT-LLM's profiles have one pricing for every release: their label
    is not read."""
    version = (row.get("backend_version") or "").strip()
    if (row.get("backend") or "").strip() == "vllm" and version and parse_version(version) is None:
        return (f"backend_version: {version!r} is not a vLLM release the model knows (MAJOR.MINOR..., or blank: "
                "the sample's unversioned runs)")
    return ""


def _clients_from_batch(case: RowCase, row: dict, mode: str, model) -> str:
    """A row without ``silicon_concurrency=N``: an aggregated row whose ``batch_size`` is given is simulated
    with as many clients as its engine runs sequences at once (``batch_size`` x its attention-DP ranks,
    as :func:`_pool` reads it) and noted ``concurrency_from_batch``; else why it is skipped (module doc)."""
    if mode == "disagg":
        if not (row.get("prefill_num_workers") and row.get("decode_num_workers")):
            return _NO_WORKERS
        return "silicon_data_source: no silicon_concurrency=N (a disaggregated row's batch sizes do not give its clients)"
    if not (row.get("batch_size") or "").strip():
        return "silicon_data_source: no silicon_concurrency=N, and no batch_size to read the clients from"
    pool = _pool(row, "", 1, model.is_moe)
    if isinstance(pool, str):
        return pool
    case.concurrency = pool.max_num_seqs
    case.notes += ("concurrency_from_batch",)
    return ""


def map_row(row: dict) -> RowCase:
    """The row as a case to simulate, or with ``skip`` saying in one line which field stops it."""
    try:
        return _map_row(row)
    except ValueError as exc:  # RowError, and a layout the strategy or plan refuses: each names its field
        case = RowCase(row)
        case.skip = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return case


def _map_row(row: dict) -> RowCase:
    case = RowCase(row)
    backend, mode = (row.get("backend") or "").strip(), (row.get("mode") or "").strip()
    if backend not in BACKENDS:
        raise RowError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if mode not in MODES:
        raise RowError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    for key in ("silicon_ttft_ms", "silicon_tpot_ms"):
        _number(row, key)
    preset = model_preset(row.get("model_path") or "")
    if isinstance(preset, ModelConfigError):
        case.skip = f"model: {preset}"
        return case
    if preset is None:
        case.skip = f"model: no preset for {row.get('model_path')!r}"
        return case
    gpu = SYSTEMS.get((row.get("system") or "").strip())
    if gpu is None:
        case.skip = f"system: {row.get('system')!r} is not one of {', '.join(SYSTEMS)}"
        return case
    found = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source") or "")
    case.concurrency = int(found.group(1)) if found else 0
    if found and case.concurrency < 1:
        raise RowError(f"silicon_data_source: silicon_concurrency must be >= 1, got {case.concurrency}")
    case.isl, case.osl = _int(row, "isl", 0), _int(row, "osl", 0)
    if not (case.isl and case.osl):
        raise RowError(f"{'isl' if not case.isl else 'osl'}: a length is needed")
    case.skip = _unknown_version(row)
    if case.skip:
        return case
    case.runtime = runtime_of(row)
    model = get_model(preset)
    if not found:
        case.skip = _clients_from_batch(case, row, mode, model)
        if case.skip:
            return case
    workload = row_workload(row, model, gpu)
    if isinstance(workload, str):
        case.skip = workload
        return case
    workload = replace(workload, kv_precision=kv_cache_precision(
        backend, row.get("backend_version") or "", row.get("model_path") or "", preset, workload.precision,
        case.isl, case.osl))
    if mode == "disagg" and not (row.get("prefill_num_workers") and row.get("decode_num_workers")):
        case.skip = _NO_WORKERS
        return case
    prefixes = ("prefill_", "decode_") if mode == "disagg" else ("",)
    pools = [_pool(row, p, case.concurrency, model.is_moe) for p in prefixes]
    for p in pools:
        if isinstance(p, str):
            case.skip = p
            return case
    _place(case, pools, preset, model, workload, gpu, backend)
    literal = [_pool(row, p, case.concurrency, model.is_moe, compact=False) for p in prefixes]
    if literal != pools and not all(isinstance(p, Pool) and _holds_weights(case, p) for p in pools) \
            and all(isinstance(p, Pool) for p in literal):
        _place(case, literal, preset, model, workload, gpu, backend)  # the compact reading cannot hold the model
    return case


def _place(case: RowCase, pools: list[Pool], preset: str, model, workload: Workload, gpu: str, backend: str) -> None:
    """Set the case's plan, launch flags and cluster (enough 8-GPU nodes for the plan) from its pools."""
    plan = ServingPlan("agg", pool=pools[0]) if len(pools) == 1 else ServingPlan.disaggregated(*pools)
    nodes = max(1, -(-plan.gpus // NODE_GPUS))
    case.model, case.plan = preset, plan
    system = (case.row.get("system") or "").strip()
    workload = _padded(workload, pools, model, backend, _expert_format(case.row, model), gpu)
    case.launch = launch_flags(backend, preset, case.isl, case.osl, case.concurrency, tp=pools[0].strategy.tp,
                               system=system) | moe_kernel_fields(backend, _expert_format(case.row, model), gpu) \
        | version_fields(case.row, model.is_moe, workload.precision)
    case.requests_per_client = requests_per_client(backend, preset, case.isl, case.osl, system)
    model = replace(model, **launch_model_fields(backend, preset, case.isl, case.osl, system))
    routing = RoutingConfig(sampled=True) if model.is_moe else None  # module doc: the busiest expert rank
    case.ctx = CostContext(model, workload, Cluster.simple(gpu, num_gpus=NODE_GPUS * nodes, nvlink_domain_size=NODE_GPUS),
                           routing=routing)


def _padded(workload: Workload, pools: list[Pool], model, backend: str, fmt: str | None, gpu: str) -> Workload:
    """The workload with its experts' bytes padded as the row's runtime holds them
    (:func:`simcore.serving.deployment.vllm_mxfp4_padding`); pools whose experts pad differently cannot share one
    workload, so are refused."""
    factors = {vllm_mxfp4_padding(backend, fmt, gpu, model.hidden_size, model.expert_ffn_size,
                                  p.strategy.tp // p.moe_ep) for p in pools}
    if len(factors) > 1:
        raise RowError("layout: the pools split their MXFP4 experts to sizes vLLM pads differently; not modelled")
    factor = factors.pop()
    return workload if factor == 1.0 else replace(workload, expert_weight_bytes=workload.expert_weight_bytes * factor)


def _holds_weights(case: RowCase, pool: Pool) -> bool:
    """Whether the pool's GPUs hold the weights with room for a KV cache, under the row's runtime and launch."""
    runtime = get_runtime(case.runtime).with_overrides(**case.launch)
    return kv_capacity_tokens(case.ctx, pool.strategy, runtime) > 0
