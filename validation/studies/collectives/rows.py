"""The collectives study's input: the CSV schema, one measured row as a :class:`Case`, and its fabric.

A row's time comes from ``time_us``, else ``algbw_GBps``, else ``busbw_GBps`` (nccl-tests prints the
bandwidths of tiny messages as 0.00: no figure, not a bad row). Its harness is read from its
``setting``/``note`` text (:mod:`.harness`), its scale-out fabric from the optional ``fabric`` column,
else ``EFA`` / ``RoCE`` named in the text, else InfiniBand.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from simcore.collectives.constants import FABRICS
from validation.studies.collectives.harness import (
    DEFAULT_HARNESS,
    check_harness,
    devices_per_process,
    harness_of,
)
from validation.studies.common import read_csv

__all__ = ["DEFAULT_DATA", "COLUMNS", "REQUIRED_COLUMNS", "Case", "busbw_factor", "load_rows", "fabric_of",
           "parse_row"]

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "data" / "collectives_calibration.csv"
COLUMNS = ("source_url", "setting", "nodes", "gpus_per_node", "collective", "algorithm", "size_bytes",
           "time_us", "algbw_GBps", "busbw_GBps", "note", "fabric", "split")  # fabric, split optional
REQUIRED_COLUMNS = ("nodes", "gpus_per_node", "collective", "algorithm", "size_bytes", "time_us",
                    "algbw_GBps", "busbw_GBps")
_COLLECTIVE = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "all_gather": "all_gather",
               "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
               "reducescatter": "reduce_scatter",
               "alltoall": "all_to_all", "all_to_all": "all_to_all", "send_recv": "send_recv",
               "sendrecv": "send_recv"}
_ALGORITHM = {"default": "auto", "auto": "auto", "ring": "ring", "tree": "tree", "nvls": "nvls",
              "nvlstree": "nvls_tree", "nvls_tree": "nvls_tree", "hierarchical": "hierarchical",
              "direct": "direct", "pairwise": "pairwise"}
_FABRIC_WORDS = (("efa", re.compile(r"\bEFA\b")), ("roce", re.compile(r"\bRoCE", re.IGNORECASE)))


@dataclass(frozen=True)
class Case:
    """One measurement: a collective on ``nodes`` x ``gpus_per_node`` GPUs, measured time in seconds."""

    collective: str
    algorithm: str
    nodes: int
    gpus_per_node: int
    size_bytes: float
    measured_time_s: float
    concurrent_groups: int = 1
    source: str = ""
    harness: str = DEFAULT_HARNESS  # what measured it (see :mod:`.harness`)
    devices_per_process: int = 1    # GPUs the measuring process issued the collective on
    fabric: str = "ib"              # scale-out network between the nodes (see :func:`fabric_of`)

    @property
    def n_ranks(self) -> int:
        return self.nodes * self.gpus_per_node


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests busbw / algbw: 2(n-1)/n for all-reduce, (n-1)/n for AG/RS/A2A, 1 for send/recv."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    return 1.0 if collective == "send_recv" else (n - 1) / n


def load_rows(path: str | Path) -> list[dict[str, str]]:
    """The CSV's rows; ``ValueError`` (one line) for an unknown or missing column."""
    header, rows = read_csv(path, REQUIRED_COLUMNS)
    for name in header:
        if name not in COLUMNS:
            raise ValueError(f"{path}: unknown column {name!r}; expected columns {', '.join(COLUMNS)}")
    for line, row in enumerate(rows, start=2):
        fabric = row.get("fabric", "")
        if fabric and fabric.lower() not in FABRICS:
            raise ValueError(f"{path}: line {line}: fabric: unknown fabric {fabric!r}; choose one of: "
                             f"{', '.join(FABRICS)}")
    return rows


def fabric_of(row: dict[str, str]) -> str:
    """The row's scale-out fabric: its ``fabric`` column, else ``EFA`` / ``RoCE`` named in its setting or
    note, else ``ib`` (the column is checked by :func:`load_rows`)."""
    if row.get("fabric"):
        return row["fabric"].lower()
    text = row.get("setting", "") + " " + row.get("note", "")
    return next((name for name, word in _FABRIC_WORDS if word.search(text)), "ib")


def _number(row: dict[str, str], field: str, kind=float, zero_is_blank: bool = False):
    text = row.get(field, "")
    if text == "" or (zero_is_blank and _is_zero(text)):
        return None
    try:
        value = kind(float(text)) if kind is int else float(text)
    except ValueError:
        raise ValueError(f"{field}: cannot parse {text!r}") from None
    if not math.isfinite(value) or value <= 0 or (kind is int and value != float(text)):
        what = "integer" if kind is int else "number"
        raise ValueError(f"{field}: must be a positive {what}, got {text!r}")
    return value


def _is_zero(text: str) -> bool:
    try:
        return float(text) == 0.0
    except ValueError:
        return False


def parse_row(row: dict[str, str], harness: str = "auto") -> Case:
    """A :class:`Case` from one CSV row; ``ValueError`` with the reason when the row is unusable.

    ``harness``: ``auto`` reads it from the row's ``setting`` and ``note``; a harness name forces it."""
    coll = _COLLECTIVE.get(row.get("collective", "").lower())
    if coll is None:
        raise ValueError(f"unknown collective {row.get('collective')!r}")
    algo = _ALGORITHM.get(row.get("algorithm", "").lower())
    if algo is None:
        raise ValueError(f"unknown algorithm {row.get('algorithm')!r}")
    nodes, per_node, size = (_number(row, f, k) for f, k in (("nodes", int), ("gpus_per_node", int),
                                                              ("size_bytes", float)))
    if nodes is None or per_node is None or size is None:
        raise ValueError("missing nodes, gpus_per_node or size_bytes")
    n = nodes * per_node
    # nccl-tests prints bandwidths of tiny messages as 0.00: no figure, not a bad row
    time_us, algbw, busbw = (_number(row, f, zero_is_blank=f != "time_us")
                             for f in ("time_us", "algbw_GBps", "busbw_GBps"))
    if time_us is not None:
        measured = time_us * 1e-6
    elif algbw is not None:
        measured = size / (algbw * 1e9)
    elif busbw is not None and n > 1:
        measured = size / (busbw * 1e9 / busbw_factor(coll, n))
    else:
        raise ValueError("no time_us, algbw_GBps or usable busbw_GBps")
    text = row.get("setting", "") + " " + row.get("note", "")
    match = re.search(r"(\d+)\s+concurrent group", text)
    groups = int(match.group(1)) if match else 1
    harness = harness_of(text) if check_harness(harness) == "auto" else harness
    return Case(coll, algo, nodes, per_node, size, measured, groups, row.get("source_url", ""), harness,
                devices_per_process(harness, text, per_node), fabric_of(row))


