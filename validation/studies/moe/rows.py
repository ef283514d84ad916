"""The MoE study's input: a row of ``ep_alltoall_deepep.csv`` as a :class:`MoeCase`, labelled ``fit``
when its source is one of :data:`FIT_SOURCES`, else ``test``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simcore.moe.deepep import fp8_token_bytes
from validation.studies.common import read_csv

__all__ = ["FIT_SOURCES", "MoeCase", "parse_row", "load_cases"]

#: Commits of the DeepEP README whose rows the constants are fitted on.
FIT_SOURCES = ("ebfe47e46fa86a5b41be96c326a92f62ed6721da",)
_MODES = {"intranode": "normal", "internode": "normal", "low_latency": "low_latency"}


@dataclass(frozen=True)
class MoeCase:
    """One measured row: the kernel's mode, its EP group and token volume, the measurement."""

    line: int
    source: str
    split: str  # fit | test
    mode: str  # normal | low_latency
    kernel: str
    op: str  # dispatch | combine
    gpu: str
    ep: int
    ranks_per_node: int
    tokens: int
    top_k: int
    token_bytes: float
    ll_nvlink: bool
    latency_s: float | None
    bandwidth_bytes_per_s: float | None


def _gpu_name(text: str) -> str | None:
    text = text.upper()
    names = [name for key, name in (("H800", "h800"), ("H200", "h200"), ("H100", "h100-sxm")) if key in text]
    return names[0] if len(names) == 1 else None


def _float(row: dict, field: str) -> float | None:
    text = (row.get(field) or "").strip()
    return float(text) if text else None


def parse_row(row: dict[str, str], line: int) -> MoeCase:
    """A row as a case; ValueError with the reason when it cannot be priced."""
    kernel = (row.get("kernel") or "").strip()
    if kernel not in _MODES:
        raise ValueError(f"kernel {kernel!r} is not modelled (DeepEP normal or low-latency kernels only)")
    gpu = _gpu_name(row.get("hardware", ""))
    if gpu is None:
        raise ValueError(f"hardware {row.get('hardware')!r} does not name one GPU of the catalog")
    op = (row.get("op") or "").strip()
    if op not in ("dispatch", "combine"):
        raise ValueError(f"op {op!r} is not dispatch or combine")
    hidden = int(float(row["hidden"]))
    dtype = (row.get(f"{op}_dtype") or "BF16").strip().upper()
    token_bytes = fp8_token_bytes(hidden) if dtype == "FP8" else 2.0 * hidden
    latency_us, bw = _float(row, "latency_us"), _float(row, "bandwidth_GBps")
    if latency_us is None and bw is None:
        raise ValueError("neither latency_us nor bandwidth_GBps given")
    text = f"{row.get('library', '')} {row.get('note', '')}".lower()
    source = row.get("source_url", "")
    ep = int(float(row["ep_size"]))
    return MoeCase(line, source, "fit" if any(s in source for s in FIT_SOURCES) else "test", _MODES[kernel],
                   kernel, op, gpu, ep, min(int(float(row.get("gpus_per_node") or 8)), ep),
                   int(float(row["tokens_per_rank"])), int(float(row["topk"])), token_bytes,
                   "pure rdma" not in text, None if latency_us is None else latency_us * 1e-6,
                   None if bw is None else bw * 1e9)


def load_cases(path: str | Path) -> tuple[list[MoeCase], list[tuple[int, str]]]:
    cases, skipped = [], []
    _, rows = read_csv(path, ("kernel", "hardware", "op", "hidden", "ep_size", "tokens_per_rank", "topk"))
    for line, row in enumerate(rows, start=2):
        try:
            cases.append(parse_row(row, line))
        except (ValueError, KeyError, TypeError) as exc:
            skipped.append((line, str(exc).strip("'")))
    return cases, skipped
