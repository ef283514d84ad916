"""Search curves of a job: best valid tokens/s/GPU found after each proxy call.

Read, in order of preference, from the job's ``search_curve`` (in ``summary.json`` or
``results.json``: ``{"calls": [...], "best": [...]}``, ``[[call, best], ...]`` or
``[{"call": ..., "best": ...}, ...]``), from ``metrics.jsonl`` (rows with ``call`` and ``best``), or
from ``candidates.csv`` (one row per proposal: the running maximum of valid throughputs).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Curve", "read_curve"]

_VALUE_COLUMNS = ("tokens_per_s_per_gpu", "proxy_tokens_per_s_per_gpu", "value", "throughput")
_CALL_COLUMNS = ("call", "calls", "index", "step")


@dataclass(frozen=True)
class Curve:
    """Best tokens/s/GPU after ``calls[i]`` proxy calls (points before the first valid one dropped)."""

    calls: tuple[float, ...]
    best: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        if len(self.calls) != len(self.best):
            raise ValueError(f"curve: {len(self.calls)} calls but {len(self.best)} values")


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _curve(points, source: str) -> Curve | None:
    points = [(float(c), float(b)) for c, b in points if _finite(c) and _finite(b)]
    if not points:
        return None
    calls, best = zip(*points, strict=True)
    return Curve(tuple(calls), tuple(best), source)


def _from_data(value) -> Curve | None:
    if isinstance(value, dict):
        calls, best = value.get("calls") or [], value.get("best") or []
        return _curve(zip(calls, best, strict=False), "search_curve")
    if isinstance(value, list):
        pts = [(p.get("call"), p.get("best")) if isinstance(p, dict) else tuple(p)[:2] for p in value
               if isinstance(p, dict) or (isinstance(p, list | tuple) and len(p) >= 2)]
        return _curve(pts, "search_curve")
    return None


def _from_metrics(path: Path) -> Curve | None:
    points = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            points.append((row.get("call"), row.get("best")))
    return _curve(points, "metrics.jsonl")


def _truthy(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "valid", "ok")


def _from_candidates(path: Path) -> Curve | None:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        fields = reader.fieldnames or []
        value_col = next((c for c in _VALUE_COLUMNS if c in fields), None)
        if value_col is None:
            return None
        call_col = next((c for c in _CALL_COLUMNS if c in fields), None)
        best, points = -math.inf, []
        for i, row in enumerate(reader, 1):
            try:
                value = float(row[value_col])
            except (TypeError, ValueError):
                value = math.nan
            valid = _truthy(row["valid"]) if "valid" in fields else not (row.get("reasons") or "").strip()
            if valid and math.isfinite(value):
                best = max(best, value)
            call = float(row[call_col]) if call_col and (row.get(call_col) or "").strip() else float(i)
            points.append((call, best))
    return _curve(points, "candidates.csv")


def read_curve(job: Path, data: dict) -> Curve | None:
    """The job's search curve, or ``None`` when it recorded none (or an unreadable one)."""
    try:
        if "search_curve" in data and (curve := _from_data(data["search_curve"])):
            return curve
        if (job / "metrics.jsonl").is_file() and (curve := _from_metrics(job / "metrics.jsonl")):
            return curve
        if (job / "candidates.csv").is_file():
            return _from_candidates(job / "candidates.csv")
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return None
