"""Rows of ``wide_ep_published.csv``: one published multi-node deployment's throughput per node.

Each row is one phase of one disaggregated DeepSeek deployment, measured on its own pool as its source
measured it (the other phase "assumed unlimited"): ``phase`` ``prefill`` (input tokens/s per node) or
``decode`` (output tokens/s per node), on ``nodes`` nodes of ``gpus_per_node`` GPUs, tensor-parallel
degree ``tp`` inside ``ep`` attention data-parallel groups whose routed experts are split ``ep`` ways
(with ``redundant_experts`` replicas: EPLB). The load: ``tokens_per_gpu_step`` prompt tokens per GPU per
prefill step (SGLang's ``--chunked-prefill-size`` over its DP ranks), ``input_len`` (a prefill row
without one takes ``kv_len``), ``batch_per_gpu`` decoding sequences at context ``kv_len``; a decode row
without a batch states the users' speed instead (``tokens_per_s_per_user``), and its batch is the
throughput over that speed. ``cache_hit_share``: the share of the published input tokens that hit a KV
cache and were not computed (DeepSeek counts them in its prefill throughput; the simulator computes every
token it is given, so the study compares the computed share). Blank cells are what the source does not
state; the ``note`` says what each row leaves unsaid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from validation.studies.common import read_csv
from validation.studies.common.split import split_of

__all__ = ["COLUMNS", "TOPOLOGIES", "WideEpCase", "load_cases"]

COLUMNS = ("source_url", "source", "hardware", "model", "precision", "phase", "nodes", "gpus_per_node", "tp", "ep",
           "redundant_experts", "tokens_per_gpu_step", "batch_per_gpu", "input_len", "kv_len",
           "tokens_per_s_per_user", "cache_hit_share", "metric", "value")
#: the topology preset of each catalog GPU: HGX nodes, one 400 Gb/s InfiniBand NIC per GPU, rail-optimized
TOPOLOGIES = {"h100-sxm": "h100-ib-rail", "h800": "h800-ib-rail", "h200": "h200-ib-rail"}
_METRICS = {"prefill": "input_tokens_per_s_per_node", "decode": "output_tokens_per_s_per_node"}
#: prompt tokens per GPU per prefill step where a row does not say (the LMSYS blog's and DeepSeek's profile: 16,384)
DEFAULT_TOKENS_PER_GPU_STEP = 16384


@dataclass(frozen=True)
class WideEpCase:
    line: int
    source: str
    source_url: str
    split: str
    hardware: str
    model: str
    precision: str
    phase: str
    nodes: int
    gpus_per_node: int
    tp: int
    ep: int
    redundant_experts: int
    tokens_per_gpu_step: int
    batch_per_gpu: int
    input_len: int
    kv_len: int
    cache_hit_share: float
    value: float

    @property
    def measured(self) -> float:
        """The published figure on the tokens the GPUs computed (cache hits taken out)."""
        return self.value * (1.0 - self.cache_hit_share)

    @property
    def topology(self) -> str:
        return TOPOLOGIES[self.hardware]


def _int(row: dict, key: str, default: int | None = None) -> int:
    if not row.get(key):
        if default is None:
            raise ValueError(f"{key} is empty")
        return default
    return int(float(row[key]))


def parse_row(line: int, row: dict) -> WideEpCase:
    """One row; ``ValueError`` saying why the study cannot simulate it."""
    phase, hardware = row["phase"], row["hardware"]
    if phase not in _METRICS or row["metric"] != _METRICS[phase]:
        raise ValueError(f"phase {phase!r} with metric {row['metric']!r} (expected prefill: {_METRICS['prefill']}, "
                         f"decode: {_METRICS['decode']})")
    if hardware not in TOPOLOGIES:
        raise ValueError(f"hardware {hardware!r} has no rail-optimized preset (known: {', '.join(TOPOLOGIES)})")
    gpn, tp, ep, nodes = _int(row, "gpus_per_node"), _int(row, "tp"), _int(row, "ep"), _int(row, "nodes")
    if gpn != 8 or tp * ep != nodes * gpn:
        raise ValueError(f"tp {tp} x ep {ep} is not the {nodes} nodes of {gpn} GPUs (the presets are 8-GPU HGX nodes)")
    value, kv_len = float(row["value"]), _int(row, "kv_len", 0)
    batch = _int(row, "batch_per_gpu", 0)
    if phase == "decode" and not batch:  # the users' speed states the load: sequences = throughput / speed
        speed = float(row.get("tokens_per_s_per_user") or 0)
        if speed <= 0:
            raise ValueError("a decode row needs batch_per_gpu or tokens_per_s_per_user")
        batch = round(value / gpn / speed)
    isl = _int(row, "input_len", kv_len)
    if phase == "prefill" and isl < 1 or phase == "decode" and kv_len < 1:
        raise ValueError("a prefill row needs input_len (or kv_len), a decode row kv_len")
    return WideEpCase(line, row["source"], row["source_url"], split_of(row), hardware, row["model"],
                      row.get("precision") or "fp8", phase, nodes, gpn, tp, ep, _int(row, "redundant_experts", 0),
                      _int(row, "tokens_per_gpu_step", DEFAULT_TOKENS_PER_GPU_STEP), batch, isl, kv_len,
                      float(row.get("cache_hit_share") or 0.0), value)


def load_cases(path: str | Path) -> tuple[list[WideEpCase], list[tuple[int, str]]]:
    """The rows the study can simulate and ``(line, reason)`` for the others; ``ValueError`` for a file in
    another schema."""
    _, rows = read_csv(path, COLUMNS)
    cases, skipped = [], []
    for line, row in enumerate(rows, start=2):
        try:
            cases.append(parse_row(line, row))
        except (KeyError, ValueError) as exc:
            skipped.append((line, str(exc)))
    return cases, skipped
