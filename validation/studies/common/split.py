"""The fixed fit / test split of the shipped measurements, by source.

Every shipped CSV in ``validation/data/`` has a ``split`` column: ``fit`` rows may calibrate a
constant, ``test`` rows only score it (out of sample). A source (``source_url``) is in one split
only, across every shipped file, so no figure scored on ``test`` rows has seen their source
(:func:`mixed_sources` lists any that is not; ``tests/test_split_sources.py`` holds the shipped data to it).
A source some fit already read is a fit source: the Azure ND H100 v5 results, whose GEMM, HBM and
attention rows set kernel constants (``kernels_h100.csv``), so its two static-batch rows in
``inference_test.csv`` are ``fit`` rows too. A CSV without the column (a user's
own measurements) is all ``fit`` unless a row's source is a shipped test source: rows copied out of
a test file stay test rows.

The fit scripts call :func:`refuse_test_rows` (a test row is a one-line error,
:class:`~validation.studies.common.cli.BadInput`); the studies label every figure with :func:`split_of`
and report it per split (:func:`split_label`).
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterable
from pathlib import Path

from validation.studies.common.cli import BadInput

__all__ = ["SPLITS", "DATA_DIR", "split_of", "test_sources", "mixed_sources", "refuse_test_rows", "split_label"]

SPLITS = ("fit", "test")
DATA_DIR = Path(__file__).resolve().parents[2] / "data"


@functools.lru_cache(maxsize=1)
def test_sources() -> frozenset[str]:
    """``source_url`` of every row marked ``split=test`` in the shipped CSVs."""
    sources: set[str] = set()
    for path in sorted(DATA_DIR.glob("*.csv")):
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if (row.get("split") or "").strip() == "test":
                    sources.add((row.get("source_url") or "").strip())
    return frozenset(sources)


def mixed_sources(paths: Iterable[Path] | None = None) -> dict[str, dict[str, list[str]]]:
    """Sources whose rows are in more than one split over ``paths`` (default: every shipped CSV), each
    with, per split, the files holding its rows (the split each row's :func:`split_of` gives)."""
    seen: dict[str, dict[str, set[str]]] = {}
    for path in sorted(paths if paths is not None else DATA_DIR.glob("*.csv")):
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                source = (row.get("source_url") or "").strip()
                seen.setdefault(source, {}).setdefault(split_of(row), set()).add(Path(path).name)
    return {src: {k: sorted(v) for k, v in splits.items()} for src, splits in seen.items() if len(splits) > 1}


def split_of(row: dict) -> str:
    """``fit`` or ``test`` for one CSV row; ``ValueError`` for another value in the ``split`` column."""
    value = (row.get("split") or "").strip()
    if value and value not in SPLITS:
        raise ValueError(f"split {value!r} is not one of {', '.join(SPLITS)}")
    if value:
        return value
    return "test" if (row.get("source_url") or "").strip() in test_sources() else "fit"


def refuse_test_rows(rows: Iterable[dict], path: str | Path, first_line: int = 2) -> None:
    """:class:`BadInput` (exit 2, one line) when any row is a test row (constants are fitted on fit rows)."""
    lines = [line for line, row in enumerate(rows, start=first_line) if split_of(row) == "test"]
    if lines:
        shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
        raise BadInput(f"error: --data {path}: {len(lines)} test row(s) (split=test, lines {shown}); "
                         "fit on fit rows only (score test rows with the study or --no-fit)")


def split_label(split: str, rows: int) -> str:
    """``"test (out of sample), 24 rows"``: how every figure names its set."""
    kind = "out of sample" if split == "test" else "in sample"
    return f"{split} ({kind}), {rows} rows"
