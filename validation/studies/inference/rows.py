"""The inference study's input: the CSV schema and one row as a :class:`RowCase` (context, strategy,
metric, measured value); ``ValueError`` says why a row cannot be expressed."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.hardware.gpus import get_gpu
from simcore.models import get_model
from simcore.strategy.sharding import Strategy
from simcore.workload import Workload

__all__ = ["COLUMNS", "METRICS", "NODE_GPUS", "MMHA_KV_REREAD", "decode_kv_reread", "RowCase", "parse_row"]

COLUMNS = ("source_url", "model", "hardware", "gpus", "tp", "pp", "ep", "dp", "precision", "scenario", "batch",
           "input_len", "output_len", "metric", "value", "unit", "note", "split")
METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "ttft_ms", "tpot_ms",
           "input_tokens_per_s_per_node", "output_tokens_per_s_per_node")
NODE_GPUS = 8
#: ``Workload.decode_kv_reread`` of TensorRT-LLM's masked-MHA generation kernel (one thread block per
#: query head), fitted on the fit split by ``python -m validation.studies.inference.fit``.
MMHA_KV_REREAD = 0.6
_TRTLLM_VERSION = re.compile(r"(?:release/|\bv)(\d+)\.(\d+)")


def decode_kv_reread(row: dict, model, mmha_reread: float | None = None) -> float:
    """The decode attention generation of the row's runtime, as ``Workload.decode_kv_reread``.

    TensorRT-LLM up to 0.8 decodes GQA with its masked-MHA kernel, one thread block per query head.
    Its XQA kernel (one KV load per group) was experimental and off by default then; its gains landed
    in 0.8 (docs/source/blogs/XQA-kernel.md), for 128-wide heads only (``gpt_attention`` support
    matrix). So a row keeps masked MHA unless it is from 0.8 with 128-wide heads and its harness set
    ``TRTLLM_ENABLE_XQA=1`` (said in ``note``). The version comes from ``source_url``
    (``release/0.5.0``, ``/v0.8.0/``) or ``note`` (``v0.6.1``). Any other or later runtime shares each
    KV head's load across its group (0), as FlashInfer, FlashAttention and XQA do. ``mmha_reread``
    replaces the fitted :data:`MMHA_KV_REREAD` (the fit's grid).
    """
    text = f"{row.get('source_url') or ''} {row.get('note') or ''}"
    match = _TRTLLM_VERSION.search(text) if "tensorrt-llm" in text.lower() else None
    if match is None or model.is_mla or model.num_heads == model.num_kv_heads:
        return 0.0
    version = (int(match.group(1)), int(match.group(2)))
    if version >= (0, 9):
        return 0.0
    xqa = version >= (0, 8) and model.head_dim == 128 and "TRTLLM_ENABLE_XQA=1" in text
    if xqa:
        return 0.0
    return MMHA_KV_REREAD if mmha_reread is None else mmha_reread


@dataclass
class RowCase:
    """One measurement, made expressible: context, strategy, metric and measured value."""

    ctx: CostContext
    strategy: object
    metric: str
    value: float
    gpus: int


def _int(row: dict, key: str, default: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        if default is None:
            raise ValueError(f"{key} is empty")
        return default
    value = float(text)
    if value != int(value) or value < 1:
        raise ValueError(f"{key}={text!r} is not a positive integer")
    return int(value)


def parse_row(row: dict) -> RowCase:
    """The case a CSV row describes; ``ValueError`` says why a row cannot be expressed."""
    model = get_model((row.get("model") or "").strip())
    gpu = get_gpu((row.get("hardware") or "").strip())
    metric = (row.get("metric") or "").strip()
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is not one of {', '.join(METRICS)}")
    value = float(row.get("value") or "nan")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"value {row.get('value')!r} is not a positive number")
    gpus, tp, pp = _int(row, "gpus"), _int(row, "tp", 1), _int(row, "pp", 1)
    ep = _int(row, "ep", 1) if model.is_moe else 1
    if gpus % (tp * ep * pp):
        raise ValueError(f"gpus={gpus} is not a multiple of tp*ep*pp={tp * ep * pp}")
    phase = (row.get("scenario") or "").strip()
    batch = _int(row, "batch")
    input_len = _int(row, "input_len")
    output_len = _int(row, "output_len", 1)
    precision = (row.get("precision") or "").strip()
    workload = Workload(phase, precision, input_len, output_len, decode_kv_reread=decode_kv_reread(row, model))
    replica_batch = batch * ep if phase == "decode" else batch
    nodes = max(1, gpus // NODE_GPUS)
    cluster = Cluster.simple(gpu, gpus, nvlink_domain_size=min(gpus, NODE_GPUS) if nodes > 1 else max(gpus, 1))
    strategy = Strategy(tp=tp, ep=ep, pp=pp, dp=gpus // (tp * ep * pp), batch=replica_batch, sharding={})
    return RowCase(CostContext(model, workload, cluster), strategy, metric, value, gpus)
