"""Inference study: predict published end-to-end measurements with the simulator and the proxy.

``run(data_path, out_dir)`` reads any CSV in the schema of ``inference_calibration.csv``
(``validation/data/README.md``), predicts each row's metric, and writes ``rows.csv`` (the input
columns plus ``sim_value``, ``proxy_value``, ``rel_error``, ``skipped_reason``), ``summary.json``,
``report.md`` and ``scatter.png`` into ``out_dir``. Every figure is given per split with its row
count (``fit`` rows calibrated a constant, ``test`` rows did not: ``validation/split.py``). Rows the
system cannot express (unknown model or hardware, missing batch, an unknown metric) are skipped with
the reason; the study goes on.

How a row becomes a strategy: ``ep`` attention groups of ``tp`` GPUs each (DP-attention when
``ep > 1``), ``pp`` stages, and ``dp = gpus / (tp * ep * pp)`` replicas. ``batch`` is the static
batch (``static``), the prompts of one replica (``prefill``) or the sequences per device
(``decode``: a replica then holds ``batch * ep`` sequences). Per-node metrics use 8 GPUs per node.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from simcore.cluster import Cluster
from simcore.lowering import CostContext
from simcore.workload import Workload
from validation.split import split_of

__all__ = ["COLUMNS", "METRICS", "RowCase", "parse_row", "predict", "run"]

COLUMNS = ("source_url", "model", "hardware", "gpus", "tp", "pp", "ep", "dp", "precision", "scenario", "batch",
           "input_len", "output_len", "metric", "value", "unit", "note", "split")
METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "ttft_ms", "tpot_ms",
           "input_tokens_per_s_per_node", "output_tokens_per_s_per_node")
_NODE_GPUS = 8
#: ``Workload.decode_kv_reread`` of TensorRT-LLM's masked-MHA generation kernel (one thread block per
#: query head), fitted on the fit split by ``python -m validation.fit_inference``.
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
    from simcore.hardware import get_gpu
    from simcore.models import get_model
    from simcore.strategy import Strategy

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
    nodes = max(1, gpus // _NODE_GPUS)
    cluster = Cluster.simple(gpu, gpus, nvlink_domain_size=min(gpus, _NODE_GPUS) if nodes > 1 else max(gpus, 1))
    strategy = Strategy(tp=tp, ep=ep, pp=pp, dp=gpus // (tp * ep * pp), batch=replica_batch, sharding={})
    return RowCase(CostContext(model, workload, cluster), strategy, metric, value, gpus)


def _metric(case: RowCase, result) -> float:
    per_gpu = result.tokens_per_s_per_gpu
    return {"output_tokens_per_s": result.tokens_per_s, "output_tokens_per_s_per_gpu": per_gpu,
            "ttft_ms": result.ttft_s * 1e3, "tpot_ms": result.tpot_s * 1e3,
            "input_tokens_per_s_per_node": per_gpu * min(case.gpus, _NODE_GPUS),
            "output_tokens_per_s_per_node": per_gpu * min(case.gpus, _NODE_GPUS)}[case.metric]


def _graph(case: RowCase):
    from topologies import build_topology

    name = {"h100-sxm": "h100", "h200": "h200", "h800": "h800"}[case.ctx.cluster.gpu.name]
    if case.gpus <= _NODE_GPUS and name == "h100":
        return build_topology("hgx-h100")
    return build_topology(f"{name}-ib-rail", num_nodes=max(1, math.ceil(case.gpus / _NODE_GPUS)))


def predict(case: RowCase, simulate_too: bool = True, engine=None) -> tuple[float, float]:
    """(simulator, proxy) prediction of the row's metric (the simulator's is NaN when not run)."""
    from simcore.engine import EngineConfig, simulate
    from simcore.proxy import evaluate

    proxy = _metric(case, evaluate(case.ctx, case.strategy))
    if not simulate_too:
        return float("nan"), proxy
    sim = simulate(case.ctx, _graph(case), case.strategy, engine or EngineConfig())
    return _metric(case, sim), proxy


def _stats(errors: list[float]) -> dict:
    """Median and geometric-mean |relative error| (``exp(mean |ln(pred / meas)|) - 1``)."""
    if not errors:
        return {"rows": 0}
    geo = math.exp(statistics.fmean(abs(math.log1p(e)) for e in errors)) - 1
    return {"rows": len(errors), "median_abs_rel_error": statistics.median(abs(e) for e in errors),
            "geomean_abs_rel_error": geo, "median_rel_error": statistics.median(errors)}


def run(data_path: str | Path, out_dir: str | Path, engine=None, simulate_too: bool = True) -> dict:
    """Predict every row, write the outputs, return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(data_path, newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        rows = list(reader)
    unknown = [c for c in header if c not in COLUMNS]
    missing = [c for c in ("model", "hardware", "gpus", "scenario", "metric", "value") if c not in header]
    records = []
    for line, row in enumerate(rows, start=2):
        rec = {k: row.get(k, "") for k in header} | {"line": line, "split": "", "sim_value": "", "proxy_value": "",
                                                       "rel_error": "", "proxy_rel_error": "", "skipped_reason": ""}
        try:
            rec["split"] = split_of(row)
            if missing:
                raise ValueError(f"missing column(s) {', '.join(missing)}")
            case = parse_row(row)
            sim, proxy = predict(case, simulate_too, engine)
            rec |= {"sim_value": sim, "proxy_value": proxy, "proxy_rel_error": proxy / case.value - 1,
                    "rel_error": (sim / case.value - 1) if sim == sim else ""}
        except (ValueError, KeyError, ZeroDivisionError) as exc:
            rec["skipped_reason"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        records.append(rec)
    return _write(records, header, unknown, out, data_path)


def _write(records, header, unknown, out: Path, data_path) -> dict:
    from validation.studies.inference_report import write_outputs

    return write_outputs(records, header, unknown, out, data_path, _stats)
