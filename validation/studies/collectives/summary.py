"""The collectives study's figures: error statistics per split (fit / test), size band, fabric and group.

Every figure names the set it is computed on: ``fit`` rows calibrated the constants (in sample), ``test``
rows did not (out of sample; :mod:`validation.studies.common.split`). Multi-node rows are also reported per scale-out
fabric (``ib`` / ``efa`` / ``roce``), with the median |error| the project's target is stated in.
"""

from __future__ import annotations

import numpy as np

from simcore.files import dumps
from validation.studies.common import split_kind

__all__ = ["BANDS", "MIB", "band_of", "stats", "summarize", "print_summary"]

MIB = 2**20
BANDS = ("<1MiB", ">=1MiB")


def band_of(size_bytes: float) -> str:
    return ">=1MiB" if size_bytes >= MIB else "<1MiB"


def stats(errors: list[float]) -> dict[str, float | int]:
    """Row count, geomean and median of |relative error| (floored at 1e-6 so the geomean is finite)."""
    abs_err = np.maximum(np.abs(np.asarray(errors, dtype=float)), 1e-6)
    return {"rows": len(errors), "geomean_abs_rel_error": float(np.exp(np.mean(np.log(abs_err)))),
            "median_abs_rel_error": float(np.median(abs_err))}


def _grouped(used: list[dict], key) -> dict[str, dict]:
    groups: dict[str, list[float]] = {}
    for r in used:
        groups.setdefault(key(r), []).append(r["_err"])
    return {k: stats(v) for k, v in sorted(groups.items())}


def summarize(records: list[dict], engine: str = "analytic") -> dict:
    """geomean / median |relative error|, each keyed by its split: overall, per size band, per harness,
    per multi-node fabric (``split/fabric/Nnodes-band``) and per collective x GPUs x band."""
    used = [r for r in records if r["skipped_reason"] == ""]
    summary: dict = {"engine": engine, "rows_total": len(records), "rows_used": len(used),
                     "rows_skipped": len(records) - len(used)}
    if not used:
        return summary
    summary["splits"] = {}
    for split in ("fit", "test"):
        rows = [r for r in used if r["split"] == split]
        if rows:
            summary["splits"][split] = {**stats([r["_err"] for r in rows]),
                                        "bands": _grouped(rows, lambda r: r["_band"])}
    summary["harnesses"] = _grouped(used, lambda r: f"{r['split']}/{r['_case'].harness}/{r['_band']}")
    multi = [r for r in used if r["_case"].nodes > 1]
    summary["multi_node"] = _grouped(multi, lambda r: f"{r['split']}/{r['_case'].fabric}/{r['_band']}")
    summary["groups"] = _grouped(used, lambda r: f"{r['split']}/{r['_case'].collective}/"
                                                 f"{r['_case'].nodes}x{r['_case'].gpus_per_node}gpu/{r['_band']}")
    return summary


def _line(label: str, s: dict) -> str:
    return (f"{label:46s} rows {s['rows']:4d}  geomean |err| {s['geomean_abs_rel_error']:6.1%}  "
            f"median |err| {s['median_abs_rel_error']:6.1%}")


def print_summary(summary: dict) -> None:
    """The figures, each line labelled with its split (``fit`` = in sample, ``test`` = out of sample)."""
    for split, s in summary.get("splits", {}).items():
        print(_line(f"[{split}, {split_kind(split)}] all rows", s))
        for band, b in s["bands"].items():
            print(_line(f"[{split}] band {band}", b))
    for key, s in summary.get("multi_node", {}).items():
        split, fabric, band = key.split("/")
        print(_line(f"[{split}] multi-node {fabric} {band}", s))
    for key, s in summary.get("harnesses", {}).items():
        split, rest = key.split("/", 1)
        print(_line(f"[{split}] harness {rest}", s))
    for key, s in summary.get("groups", {}).items():
        split, rest = key.split("/", 1)
        print(_line(f"[{split}] {rest}", s))
    print(dumps({k: v for k, v in summary.items() if k not in ("groups", "harnesses")}))
