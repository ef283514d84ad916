"""What the studies, their scripts and the benchmarks share; nothing here imports a study or a benchmark,
so every one of them may import it.

This module: reporting helpers (CSV tables, matplotlib figures, set labels, percentages); writes go
through :func:`planner.apps.common.atomic_write_text`, so a reader never sees half a file. Beside it:
:mod:`.split` (the fixed fit / test split of the shipped measurements), :mod:`.cli` (the scripts'
one-line errors) and :mod:`.scenarios` (the benchmark scenarios as composed configs and cost contexts).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from planner.apps.common import atomic_save_figure, atomic_write_json, atomic_write_text

__all__ = ["atomic_write_json", "atomic_write_text", "read_csv", "write_csv", "pyplot", "save_figure", "split_kind", "pct"]


def read_csv(path: str | Path, required: Sequence[str], field: str = "data") -> tuple[list[str], list[dict[str, str]]]:
    """``(header, rows)`` of an input CSV (header names and cells stripped, a short row's cells ``""``);
    ``ValueError`` naming ``field`` (the option that gave the path) when the file has no header or lacks
    one of ``required``: a file in another schema is bad input, not a file of skipped rows."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in (reader.fieldnames or [])]
        reader.fieldnames = header
        rows = [{k: (v or "").strip() for k, v in row.items() if k is not None} for row in reader]
    if not header:
        raise ValueError(f"{field}: {path} is empty (no header row)")
    missing = [name for name in required if name not in header]
    if missing:
        raise ValueError(f"{field}: {path} lacks column(s) {', '.join(missing)}")
    return header, rows


def write_csv(path: str | Path, columns: Sequence[str], rows: Iterable[Mapping]) -> Path:
    """``rows`` (dicts; keys outside ``columns`` ignored, missing ones blank) as a CSV with header
    ``columns``, written atomically; returns the path."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(path, buf.getvalue())


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (studies run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 100, tight: bool = True) -> None:
    """Lay out (``tight``), save and close ``fig``."""
    if tight:
        fig.tight_layout()
    atomic_save_figure(fig, path, dpi=dpi)
    pyplot().close(fig)


def split_kind(split: str) -> str:
    """``in sample`` for the fit set (its rows calibrated a constant), ``out of sample`` otherwise."""
    return "in sample" if split == "fit" else "out of sample"


def pct(value: float | None, spec: str = ".1%") -> str:
    """``value`` formatted as a percentage, ``-`` when there is none."""
    return "-" if value is None else format(value, spec)
