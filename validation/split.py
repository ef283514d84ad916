"""The fixed fit / test split of the shipped measurements, by source.

Every shipped CSV in ``validation/data/`` has a ``split`` column: ``fit`` rows may calibrate a
constant, ``test`` rows only score it (out of sample). A source (``source_url``) is in one split
only, so no figure scored on ``test`` rows has seen their source. A CSV without the column (a user's
own measurements) is all ``fit`` unless a row's source is a shipped test source: rows copied out of
a test file stay test rows.

The ``fit_*`` scripts call :func:`refuse_test_rows`; the studies label every figure with
:func:`split_of` and report it per split (:func:`split_label`).
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = ["SPLITS", "DATA_DIR", "BadInput", "OneLineParser", "read_rows", "run_script", "split_of", "test_sources",
           "refuse_test_rows", "split_label"]

SPLITS = ("fit", "test")
DATA_DIR = Path(__file__).resolve().parent / "data"


class BadInput(SystemExit):
    """Input a fitting script cannot use: exit status 2, the one-line message as ``str(exc)``
    (:func:`run_script` prints it; a caller that catches it reads it)."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors (a bad choice, a value of the wrong type, a missing argument) are a
    :class:`BadInput`: one line naming the argument, exit 2, instead of argparse's usage block."""

    def error(self, message: str):
        raise BadInput(f"{self.prog}: {message}")


def read_rows(path: Path, need: Sequence[str]) -> list[dict]:
    """The rows of CSV ``path``, or a :class:`BadInput` naming the file: unreadable, without rows, or
    without the columns ``need`` names."""
    try:
        with Path(path).open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise BadInput(f"--data: cannot read {path}: {exc.strerror or exc}") from None
    missing = [c for c in need if rows and c not in rows[0]]
    if not rows or missing:
        raise BadInput(f"--data: {path} needs columns {', '.join(need)}"
                       + (f" (missing {', '.join(missing)})" if missing else " and rows"))
    return rows


def run_script(main: Callable[[], object]) -> None:
    """Run a script's ``main()`` as ``python -m``: a :class:`BadInput` prints its line and exits 2."""
    try:
        main()
    except BadInput as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None


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
