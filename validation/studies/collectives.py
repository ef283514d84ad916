"""Collective times against published measurements (nccl-tests / XLA / torch tables).

Reads any CSV in the schema of ``validation/data/collectives_calibration.csv``, simulates each row with
the analytic model (:func:`simcore.collectives.collective_time_s`) or the flow simulator
(:func:`simcore.collectives.flows.simulate_collective`) and writes ``rows.csv``, ``summary.json`` and
``busbw.png`` into the output folder. Bad rows are reported and skipped; a bad header is an error.
Each row is charged the per-call overhead of the harness that measured it (:mod:`.harness`) and runs on
its scale-out fabric: the optional ``fabric`` column (``ib`` | ``efa`` | ``roce``), else ``EFA`` or
``RoCE`` named in its ``setting``/``note``, else InfiniBand; an unknown value in the column is an error
for the whole file. Every figure is labelled with its split (``fit`` / ``test``, :mod:`validation.split`:
the optional ``split`` column, else whether the row's source is a shipped test source).

Run: ``python -m validation.studies.collectives --data PATH --out DIR [--engine analytic|flow]
[--harness auto|nccl-tests|xla|torch]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from simcore.collectives import DEFAULT, Fabric, NcclConstants, collective_time_s, select
from simcore.collectives.constants import FABRICS
from validation.split import split_of

from .collectives_plot import plot_busbw
from .collectives_summary import band_of, print_summary, summarize
from .harness import (
    DEFAULT_HARNESS,
    HARNESS_OVERHEAD_S,
    HARNESSES,
    PER_DEVICE_LAUNCH_S,
    check_harness,
    devices_per_process,
    harness_of,
    overhead_s,
)

__all__ = ["COLUMNS", "REQUIRED_COLUMNS", "HARNESS_OVERHEAD_S", "PER_DEVICE_LAUNCH_S", "devices_per_process",
           "overhead_s", "Case", "load_rows", "parse_row", "simulate_case", "summarize",
           "run", "evaluate", "main", "DEFAULT_DATA", "busbw_factor", "fabric_of", "TOPOLOGY_OF_FABRIC"]

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "collectives_calibration.csv"
COLUMNS = ("source_url", "setting", "nodes", "gpus_per_node", "collective", "algorithm", "size_bytes",
           "time_us", "algbw_GBps", "busbw_GBps", "note", "fabric", "split")  # fabric, split optional
REQUIRED_COLUMNS = ("nodes", "gpus_per_node", "collective", "algorithm", "size_bytes", "time_us",
                    "algbw_GBps", "busbw_GBps")
OUTPUT_COLUMNS = ("harness", "sim_time_us", "sim_busbw_GBps", "sim_algorithm", "rel_error", "skipped_reason")
_COLLECTIVE = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "all_gather": "all_gather",
               "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
               "reducescatter": "reduce_scatter",
               "alltoall": "all_to_all", "all_to_all": "all_to_all", "send_recv": "send_recv",
               "sendrecv": "send_recv"}
_ALGORITHM = {"default": "auto", "auto": "auto", "ring": "ring", "tree": "tree", "nvls": "nvls",
              "nvlstree": "nvls_tree", "nvls_tree": "nvls_tree", "hierarchical": "hierarchical",
              "direct": "direct", "pairwise": "pairwise"}
#: The topology preset a multi-node row runs on, by fabric (H200 rows share H100's NVLink4/NVSwitch and
#: 400 Gb/s-per-GPU NICs, so the H100 presets stand for them).
TOPOLOGY_OF_FABRIC = {"ib": "h100-ib-rail", "efa": "h100-efa", "roce": "h100-roce"}
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
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in (reader.fieldnames or [])]
        for name in header:
            if name not in COLUMNS:
                raise ValueError(f"{path}: unknown column {name!r}; expected columns {', '.join(COLUMNS)}")
        for name in REQUIRED_COLUMNS:
            if name not in header:
                raise ValueError(f"{path}: missing required column {name!r}")
        rows = [{k.strip(): (v or "").strip() for k, v in row.items() if k is not None} for row in reader]
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


def _topology(nodes: int, fabric: str = "ib"):
    from topologies import build_topology

    if nodes == 1:
        return build_topology("hgx-h100")
    return build_topology(TOPOLOGY_OF_FABRIC[fabric], num_nodes=nodes)


def simulate_case(case: Case, engine: str = "analytic", constants: NcclConstants = DEFAULT,
                  overheads: dict[str, float] = HARNESS_OVERHEAD_S,
                  per_device_s: float = PER_DEVICE_LAUNCH_S) -> tuple[float, str]:
    """(simulated time in seconds, algorithm used) for one case.

    The case's harness overhead (:func:`.harness.overhead_s`) replaces ``constants.launch_overhead_s``.
    The flow engine places ``concurrent_groups`` groups side by side (iota over the node's GPUs) and
    runs them together; the analytic model has no contention, so there they change nothing.
    """
    extra = overhead_s(case.harness, case.devices_per_process, overheads, per_device_s)
    constants = constants.with_overrides(launch_overhead_s=extra)
    graph = _topology(case.nodes, case.fabric)
    fabric = Fabric.from_topology(graph)
    args = (case.collective, case.size_bytes, case.n_ranks, case.gpus_per_node, fabric)
    algo = case.algorithm
    if algo == "auto":
        algo = str(select(*args, constants=constants)[0])
    if engine == "analytic":
        return float(collective_time_s(*args, algorithm=algo, constants=constants)), algo
    from simcore.collectives.flows import simulate_collective

    per = case.gpus_per_node
    groups = [[f"gpu{node * graph.graph['gpus_per_node'] + g * per + i}" for node in range(case.nodes)
               for i in range(per)] for g in range(case.concurrent_groups)]
    return simulate_collective(graph, case.collective, case.size_bytes, groups[0], algorithm=algo,
                               concurrent_groups=groups[1:] or None, constants=constants), algo


def _simulate_all(rows: list[dict[str, str]], engine: str, constants: NcclConstants,
                  harness: str = "auto") -> list[dict]:
    records = []
    for row in rows:
        record = {**{c: row.get(c, "") for c in COLUMNS}, **{c: "" for c in OUTPUT_COLUMNS}}
        record["split"] = split_of(row)
        try:
            case = parse_row(row, harness)
            record["fabric"] = case.fabric
            sim_s, algo = simulate_case(case, engine, constants)
        except ValueError as exc:
            record["skipped_reason"] = str(exc).replace("\n", " ")
            records.append(record)
            continue
        err = (sim_s - case.measured_time_s) / case.measured_time_s
        busbw = case.size_bytes / sim_s * busbw_factor(case.collective, case.n_ranks) / 1e9
        record.update(harness=case.harness, sim_time_us=f"{sim_s * 1e6:.3f}", sim_busbw_GBps=f"{busbw:.3f}", sim_algorithm=algo,
                      rel_error=f"{err:.4f}", _case=case, _err=err, _sim_s=sim_s,
                      _band=band_of(case.size_bytes))
        records.append(record)
    return records


def _write_rows(records: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS + OUTPUT_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)


def evaluate(data_path: str | Path, engine: str = "analytic", constants: NcclConstants = DEFAULT,
             harness: str = "auto") -> list[dict]:
    """One record per CSV row: its columns, the simulated figures, private ``_case``/``_err``/``_sim_s``.

    ``harness``: ``auto`` reads each row's harness from its text; a name applies that one to every row."""
    if engine not in ("analytic", "flow"):
        raise ValueError(f"unknown engine {engine!r}; choose one of: analytic, flow")
    return _simulate_all(load_rows(data_path), engine, constants, check_harness(harness))


def _write_outputs(records: list[dict], out_dir: str | Path, engine: str) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, engine)
    _write_rows(records, out / "rows.csv")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_busbw(records, out / "busbw.png")
    return summary


def run(data_path: str | Path, out_dir: str | Path, constants: NcclConstants = DEFAULT,
        engine: str = "analytic", harness: str = "auto") -> dict:
    """Simulate every row of ``data_path``; write rows.csv, summary.json, busbw.png; return the summary."""
    return _write_outputs(evaluate(data_path, engine, constants, harness), out_dir, engine)


def _print_table(records: list[dict]) -> None:
    print(f"{'split':5s} {'collective':15s} {'gpus':>7s} {'fabric':>6s} {'size':>12s} {'algo':>10s} "
          f"{'meas_us':>10s} {'sim_us':>10s} {'err':>7s}")
    for r in records:
        where = f"{r['nodes']}x{r['gpus_per_node']}"
        if r["skipped_reason"]:
            print(f"{r['split']:5s} {r['collective']:15s} {where:>7s} skipped: {r['skipped_reason']}")
            continue
        c = r["_case"]
        print(f"{r['split']:5s} {c.collective:15s} {where:>7s} {c.fabric:>6s} {c.size_bytes:12.0f} "
              f"{r['sim_algorithm']:>10s} {c.measured_time_s * 1e6:10.2f} {r['_sim_s'] * 1e6:10.2f} {r['_err']:+7.1%}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="CSV in the collectives_calibration schema")
    parser.add_argument("--out", default="outputs/collectives", help="output folder")
    parser.add_argument("--engine", default="analytic", choices=("analytic", "flow"))
    parser.add_argument("--harness", default="auto", choices=("auto",) + HARNESSES,
                        help="what measured the rows (auto: read from each row's setting and note)")
    args = parser.parse_args(argv)
    records = evaluate(args.data, args.engine, harness=args.harness)
    summary = _write_outputs(records, args.out, args.engine)
    _print_table(records)
    print_summary(summary)
    return summary


if __name__ == "__main__":
    try:
        main()
    except ValueError as exc:  # bad input (an unknown fabric, a malformed header): one line, exit 2
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
