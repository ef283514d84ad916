"""MoE study: DeepEP's dispatch and combine against published measurements (``ep_alltoall_deepep.csv``).

Every row is one kernel (``intranode`` / ``internode``: DeepEP's normal kernels; ``low_latency``)
at one EP size; we price it with :mod:`simcore.moe.deepep` under the row's uniform top-k routing on
the row's GPU (H800 rows on the H800 catalog entry: its NVLink is 200 GB/s per direction, the
NIC the same 400 Gb/s as H100's). A row with a latency is compared on time; a row with a
bandwidth only on bandwidth, as DeepEP reports it: the bytes the bottleneck link class carries
(NVLink within a node, RDMA across) over the time. Rows whose ``library`` or ``note`` say "pure
RDMA" run the low-latency kernels without NVLink (DeepEP before PR #173).

Rows from the sources in :data:`FIT_SOURCES` (the initial DeepEP README, 2025-02-24) are the ones
``validation/studies/moe/fit.py`` fits the constants on, labelled ``fit``; all others are ``test``.
Rows we cannot express are reported as skipped with the reason (DeepEP V2's elastic kernel, an
unnamed GPU).

Scripts beside the study: :mod:`.fit` (``python -m validation.studies.moe.fit``: DeepEP's constants),
:mod:`.fit_kernels` (the serving runtimes' grouped expert-GEMM efficiency on their MoE kernels' timings) and
:mod:`.measure_kernels` (grouped expert GEMMs timed on a local GPU).
"""

from __future__ import annotations

from pathlib import Path

from simcore.moe.deepep import DEFAULT_DEEPEP, DeepEPConstants
from validation.studies.common import atomic_write_json, write_csv
from validation.studies.moe.model import bottleneck_bytes, error, evaluate, predict
from validation.studies.moe.plot import plot_errors
from validation.studies.moe.rows import FIT_SOURCES, MoeCase, load_cases, parse_row

__all__ = ["FIT_SOURCES", "MoeCase", "parse_row", "load_cases", "bottleneck_bytes", "predict", "error", "evaluate",
           "run"]


def _print(records: list[dict], summary: dict) -> None:
    print(f"{'split':5} {'mode':11} {'EP':>4} {'dispatch err':>24} {'combine err':>24}")
    for key in summary["by_ep"]:
        split, mode, ep = key.split("/")
        cells = []
        for op in ("dispatch", "combine"):
            errs = [f"{r['rel_error']:+.1%}" for r in records if f"{r['split']}/{r['mode']}/ep{r['ep']}" == key
                    and r["op"] == op]
            cells.append(", ".join(errs) or "-")
        print(f"{split:5} {mode:11} {ep[2:]:>4} {cells[0]:>24} {cells[1]:>24}")
    for split, s in summary["by_split"].items():
        print(f"{split}: {s['rows']} rows, median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}")


def run(data_path: str | Path, out_dir: str | Path, c: DeepEPConstants = DEFAULT_DEEPEP) -> dict:
    """Price every row, print the table, write ``rows.csv``, ``summary.json`` and ``moe_errors.png``."""
    out = Path(out_dir)
    cases, skipped = load_cases(data_path)
    if not cases:
        raise ValueError(f"data: no usable DeepEP rows in {data_path} ({len(skipped)} skipped)")
    records, summary = evaluate(cases, c)
    _print(records, summary)
    for line, reason in skipped:
        print(f"skipped line {line}: {reason}")
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "rows.csv", list(records[0]) + ["skipped"],
              records + [{"line": line, "skipped": reason} for line, reason in skipped])
    plot_errors(records, out / "moe_errors.png")
    result = {"study": "moe", "data": str(data_path), "rows_used": len(records), "rows_skipped": len(skipped),
              "fit": summary["by_split"].get("fit"), "test": summary["by_split"].get("test"),
              "median_abs_error_by_ep": {k: {op: v["median_abs_error"] for op, v in ops.items()}
                                         for k, ops in summary["by_ep"].items()},
              "figure": str(out / "moe_errors.png")}
    atomic_write_json(out / "summary.json", result)
    return result
