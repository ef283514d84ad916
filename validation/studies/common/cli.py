"""Command-line helpers of the fit, measurement and report scripts: one-line errors, exit status 2.

A script's bad input (a missing file, a CSV in another schema, a bad option) is a :class:`BadInput`:
:func:`run_script` prints its one line on stderr and exits 2, and :class:`OneLineParser` turns argparse's
usage block into such a line. Nothing here imports a study.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["BadInput", "OneLineParser", "read_rows", "run_script", "count"]


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


def count(text: str) -> int:
    """A count of at least 1, as an argparse ``type`` (argparse turns the error into a one-line usage
    error, exit 2)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value
