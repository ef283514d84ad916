"""Inference study: predict published end-to-end measurements with the simulator and the proxy.

``run(data_path, out_dir)`` reads any CSV in the schema of ``inference_calibration.csv``
(``validation/data/README.md``), predicts each row's metric, and writes ``rows.csv`` (the input
columns plus ``sim_value``, ``proxy_value``, ``rel_error``, ``skipped_reason``), ``summary.json``,
``report.md`` and ``scatter.png`` into ``out_dir``. Every figure is given per split with its row
count (``fit`` rows calibrated a constant, ``test`` rows did not: ``validation/studies/common/split.py``). Rows the
system cannot express (unknown model or hardware, missing batch, an unknown metric) are skipped with
the reason; the study goes on.

How a row becomes a strategy: ``ep`` attention groups of ``tp`` GPUs each (DP-attention when
``ep > 1``), ``pp`` stages, and ``dp = gpus / (tp * ep * pp)`` replicas. ``batch`` is the static
batch (``static``), the prompts of one replica (``prefill``) or the sequences per device
(``decode``: a replica then holds ``batch * ep`` sequences). Per-node metrics use 8 GPUs per node.

Scripts beside the study: :mod:`.fit` (``python -m validation.studies.inference.fit``: the host time per step,
the runtime's per-collective launch cost, the masked-MHA KV re-read), :mod:`.measure_decode` (forward passes
timed on a local GPU) and :mod:`.compare_measured` (those timings predicted without a serving runtime).
"""

from __future__ import annotations

from pathlib import Path

from validation.studies.common import read_csv
from validation.studies.common.split import split_of
from validation.studies.inference.predict import (
    _graph as _graph,  # importable here: fidelity.measured, fit_inference use these two
)
from validation.studies.inference.predict import _metric as _metric
from validation.studies.inference.predict import predict
from validation.studies.inference.report import write_outputs
from validation.studies.inference.rows import (
    COLUMNS,
    METRICS,
    MMHA_KV_REREAD,
    RowCase,
    decode_kv_reread,
    parse_row,
)

__all__ = ["COLUMNS", "METRICS", "MMHA_KV_REREAD", "RowCase", "decode_kv_reread", "parse_row", "predict", "run"]


def run(data_path: str | Path, out_dir: str | Path, engine=None, simulate_too: bool = True) -> dict:
    """Predict every row, write the outputs, return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header, rows = read_csv(data_path, ("model", "hardware", "gpus", "scenario", "metric", "value"))
    unknown = [c for c in header if c not in COLUMNS]
    records = []
    for line, row in enumerate(rows, start=2):
        rec = {k: row.get(k, "") for k in header} | {"line": line, "split": "", "sim_value": "", "proxy_value": "",
                                                       "rel_error": "", "proxy_rel_error": "", "skipped_reason": ""}
        try:
            rec["split"] = split_of(row)
            case = parse_row(row)
            sim, proxy = predict(case, simulate_too, engine)
            rec |= {"sim_value": sim, "proxy_value": proxy, "proxy_rel_error": proxy / case.value - 1,
                    "rel_error": (sim / case.value - 1) if sim == sim else ""}
        except (ValueError, KeyError, ZeroDivisionError) as exc:
            rec["skipped_reason"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        records.append(rec)
    if not any(rec["sim_value"] != "" for rec in records):  # nothing to compare: bad input, not an empty result
        first = next((f"line {rec['line']}: {rec['skipped_reason']}" for rec in records), "no rows")
        raise ValueError(f"data: no usable rows in {data_path} ({len(records)} skipped; {first})")
    return write_outputs(records, header, unknown, out, data_path)
