"""Collective times against published measurements (nccl-tests / XLA / torch tables).

Reads any CSV in the schema of ``validation/data/collectives_calibration.csv``, simulates each row with
the analytic model (:func:`simcore.collectives.collective_time_s`) or the flow simulator
(:func:`simcore.collectives.flows.simulate_collective`) and writes ``rows.csv``, ``summary.json`` and
``busbw.png`` into the output folder. Bad rows are reported and skipped; a bad header is an error.
Each row is charged the per-call overhead of the harness that measured it (:mod:`.harness`) and runs on
its scale-out fabric: the optional ``fabric`` column (``ib`` | ``efa`` | ``roce``), else ``EFA`` or
``RoCE`` named in its ``setting``/``note``, else InfiniBand; an unknown value in the column is an error
for the whole file. Every figure is labelled with its split (``fit`` / ``test``, :mod:`validation.studies.common.split`:
the optional ``split`` column, else whether the row's source is a shipped test source).

Run: ``python -m validation.studies.collectives --data PATH --out DIR [--engine analytic|flow]
[--harness auto|nccl-tests|xla|torch]``.

Scripts beside the study: :mod:`.fit` (``python -m validation.studies.collectives.fit``: NVLink efficiency,
ring and NVLS fill, the harnesses' per-call overheads, per fabric the NIC terms), :mod:`.fit_custom_allreduce`
(the serving runtimes' own all-reduce kernels' latencies) and :mod:`.network_routing` (static ECMP against
adaptive routing on a fat tree).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simcore.collectives import DEFAULT, NcclConstants
from validation.studies.collectives.harness import (
    HARNESS_OVERHEAD_S,
    HARNESSES,
    PER_DEVICE_LAUNCH_S,
    check_harness,
    devices_per_process,
    harness_of,
    overhead_s,
)
from validation.studies.collectives.plot import plot_busbw
from validation.studies.collectives.rows import (
    COLUMNS,
    DEFAULT_DATA,
    REQUIRED_COLUMNS,
    Case,
    busbw_factor,
    fabric_of,
    load_rows,
    parse_row,
)
from validation.studies.collectives.simulate import (
    OUTPUT_COLUMNS,
    TOPOLOGY_OF_FABRIC,
    evaluate,
    simulate_case,
)
from validation.studies.collectives.summary import print_summary, summarize
from validation.studies.common import atomic_write_json, write_csv

__all__ = ["COLUMNS", "REQUIRED_COLUMNS", "HARNESS_OVERHEAD_S", "HARNESSES", "PER_DEVICE_LAUNCH_S",
           "check_harness", "devices_per_process", "harness_of", "overhead_s", "Case", "load_rows", "parse_row",
           "simulate_case", "summarize", "run", "evaluate", "main", "DEFAULT_DATA", "busbw_factor", "fabric_of",
           "TOPOLOGY_OF_FABRIC"]


def _write_outputs(records: list[dict], out_dir: str | Path, engine: str) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, engine)
    write_csv(out / "rows.csv", COLUMNS + OUTPUT_COLUMNS, records)
    atomic_write_json(out / "summary.json", summary)
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
