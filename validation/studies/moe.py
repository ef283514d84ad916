"""MoE study: DeepEP's dispatch and combine against published measurements (``ep_alltoall_deepep.csv``).

Every row is one kernel (``intranode`` / ``internode``: DeepEP's normal kernels; ``low_latency``)
at one EP size; we price it with :mod:`simcore.moe.deepep` under the row's uniform top-k routing on
the row's GPU (H800 rows on the H800 catalog entry: its NVLink is 200 GB/s per direction, the
NIC the same 400 Gb/s as H100's). A row with a latency is compared on time; a row with a
bandwidth only on bandwidth, as DeepEP reports it: the bytes the bottleneck link class carries
(NVLink within a node, RDMA across) over the time. Rows whose ``library`` or ``note`` say "pure
RDMA" run the low-latency kernels without NVLink (DeepEP before PR #173).

Rows from the sources in :data:`FIT_SOURCES` (the initial DeepEP README, 2025-02-24) are the ones
``validation/studies/moe_fit.py`` fits the constants on, labelled ``fit``; all others are ``test``.
Rows we cannot express are reported as skipped with the reason (DeepEP V2's elastic kernel, an
unnamed GPU).
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from simcore.apps.common import atomic_write_json
from simcore.hardware import get_gpu
from simcore.moe.deepep import DEFAULT_DEEPEP, DeepEPConstants, fp8_token_bytes, uniform_time_s

__all__ = ["FIT_SOURCES", "MoeCase", "parse_row", "predict", "evaluate", "run"]

#: Commits of the DeepEP README whose rows the constants are fitted on.
FIT_SOURCES = ("ebfe47e46fa86a5b41be96c326a92f62ed6721da",)
_MODES = {"intranode": "normal", "internode": "normal", "low_latency": "low_latency"}


@dataclass(frozen=True)
class MoeCase:
    """One measured row: the kernel's mode, its EP group and token volume, the measurement."""

    line: int
    source: str
    split: str  # fit | test
    mode: str  # normal | low_latency
    kernel: str
    op: str  # dispatch | combine
    gpu: str
    ep: int
    ranks_per_node: int
    tokens: int
    top_k: int
    token_bytes: float
    ll_nvlink: bool
    latency_s: float | None
    bandwidth_bytes_per_s: float | None


def _gpu_name(text: str) -> str | None:
    text = text.upper()
    names = [name for key, name in (("H800", "h800"), ("H200", "h200"), ("H100", "h100-sxm")) if key in text]
    return names[0] if len(names) == 1 else None


def _float(row: dict, field: str) -> float | None:
    text = (row.get(field) or "").strip()
    return float(text) if text else None


def parse_row(row: dict[str, str], line: int) -> MoeCase:
    """A row as a case; ValueError with the reason when it cannot be priced."""
    kernel = (row.get("kernel") or "").strip()
    if kernel not in _MODES:
        raise ValueError(f"kernel {kernel!r} is not modelled (DeepEP normal or low-latency kernels only)")
    gpu = _gpu_name(row.get("hardware", ""))
    if gpu is None:
        raise ValueError(f"hardware {row.get('hardware')!r} does not name one GPU of the catalog")
    op = (row.get("op") or "").strip()
    if op not in ("dispatch", "combine"):
        raise ValueError(f"op {op!r} is not dispatch or combine")
    hidden = int(float(row["hidden"]))
    dtype = (row.get(f"{op}_dtype") or "BF16").strip().upper()
    token_bytes = fp8_token_bytes(hidden) if dtype == "FP8" else 2.0 * hidden
    latency_us, bw = _float(row, "latency_us"), _float(row, "bandwidth_GBps")
    if latency_us is None and bw is None:
        raise ValueError("neither latency_us nor bandwidth_GBps given")
    text = f"{row.get('library', '')} {row.get('note', '')}".lower()
    source = row.get("source_url", "")
    ep = int(float(row["ep_size"]))
    return MoeCase(line, source, "fit" if any(s in source for s in FIT_SOURCES) else "test", _MODES[kernel],
                   kernel, op, gpu, ep, min(int(float(row.get("gpus_per_node") or 8)), ep),
                   int(float(row["tokens_per_rank"])), int(float(row["topk"])), token_bytes,
                   "pure rdma" not in text, None if latency_us is None else latency_us * 1e-6,
                   None if bw is None else bw * 1e9)


def bottleneck_bytes(case: MoeCase) -> float:
    """Bytes per rank DeepEP's bandwidth figure counts: every token copy to another rank
    (low-latency); the distinct tokens per other rank over NVLink within a node, or per destination
    node, its own included, over RDMA across nodes (normal; see :mod:`simcore.moe.deepep`)."""
    ep, rpn, k, t = case.ep, case.ranks_per_node, case.top_k, case.tokens
    if case.mode == "low_latency":
        return t * k * (ep - 1) / ep * case.token_bytes
    if rpn >= ep:
        return (ep - 1) * t * (1.0 - (1.0 - 1.0 / ep) ** k) * case.token_bytes
    return ep / rpn * t * (1.0 - (1.0 - rpn / ep) ** k) * case.token_bytes


def predict(case: MoeCase, c: DeepEPConstants = DEFAULT_DEEPEP) -> float:
    """Predicted time (s) of the case's kernel on its GPU."""
    c = dataclasses.replace(c, ll_nvlink=c.ll_nvlink and case.ll_nvlink)
    return float(uniform_time_s(case.mode, case.tokens, case.top_k, case.token_bytes, case.ep,
                                case.ranks_per_node, get_gpu(case.gpu), c=c))


def error(case: MoeCase, c: DeepEPConstants = DEFAULT_DEEPEP) -> tuple[str, float]:
    """``(metric, predicted / measured - 1)``: on time where a latency is given, else on bandwidth."""
    t = predict(case, c)
    if case.latency_s is not None:
        return "time", t / case.latency_s - 1.0
    return "bandwidth", bottleneck_bytes(case) / t / case.bandwidth_bytes_per_s - 1.0


def load_cases(path: str | Path) -> tuple[list[MoeCase], list[tuple[int, str]]]:
    cases, skipped = [], []
    with open(path, newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            try:
                cases.append(parse_row(row, line))
            except (ValueError, KeyError, TypeError) as exc:
                skipped.append((line, str(exc).strip("'")))
    return cases, skipped


def _stats(values: list[float]) -> dict:
    a = [abs(v) for v in values]
    return {"rows": len(a), "median_abs_error": round(statistics.median(a), 4), "max_abs_error": round(max(a), 4)}


def evaluate(cases: list[MoeCase], c: DeepEPConstants = DEFAULT_DEEPEP) -> tuple[list[dict], dict]:
    """Per-row records and the summary: errors per (split, mode, EP size) for dispatch and combine."""
    records = []
    for case in cases:
        metric, err = error(case, c)
        records.append({"line": case.line, "split": case.split, "mode": case.mode, "kernel": case.kernel,
                        "op": case.op, "ep": case.ep, "gpu": case.gpu, "ll_nvlink": case.ll_nvlink,
                        "metric": metric, "predicted_s": predict(case, c), "rel_error": err})
    by_ep: dict[str, dict] = {}
    for r in records:
        key = f"{r['split']}/{r['mode']}/ep{r['ep']}"
        by_ep.setdefault(key, {}).setdefault(r["op"], []).append(r["rel_error"])
    order = sorted(by_ep, key=lambda k: (k.split("/")[0], k.split("/")[1], int(k.split("/")[2][2:])))
    table = {k: {op: _stats(v) for op, v in sorted(by_ep[k].items())} for k in order}
    splits = {s: _stats([r["rel_error"] for r in records if r["split"] == s])
              for s in ("fit", "test") if any(r["split"] == s for r in records)}
    return records, {"by_ep": table, "by_split": splits}


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
    with open(out / "rows.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]) + ["skipped"])
        writer.writeheader()
        writer.writerows(records)
        for line, reason in skipped:
            writer.writerow({"line": line, "skipped": reason})
    from .moe_plot import plot_errors

    plot_errors(records, out / "moe_errors.png")
    result = {"study": "moe", "data": str(data_path), "rows_used": len(records), "rows_skipped": len(skipped),
              "fit": summary["by_split"].get("fit"), "test": summary["by_split"].get("test"),
              "median_abs_error_by_ep": {k: {op: v["median_abs_error"] for op, v in ops.items()}
                                         for k, ops in summary["by_ep"].items()},
              "figure": str(out / "moe_errors.png")}
    atomic_write_json(out / "summary.json", result)
    return result
