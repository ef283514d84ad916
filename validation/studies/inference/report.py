"""Outputs of the inference study: rows.csv, summary.json, report.md and a scatter plot."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from validation.studies.common import (
    atomic_write_json,
    atomic_write_text,
    pct,
    pyplot,
    save_figure,
    write_csv,
)
from validation.studies.common.split import SPLITS, split_label

__all__ = ["stats", "write_outputs"]

_EXTRA = ("split", "sim_value", "proxy_value", "rel_error", "proxy_rel_error", "skipped_reason")


def stats(errors: list[float]) -> dict:
    """Median and geometric-mean |relative error| (``exp(mean |ln(pred / meas)|) - 1``)."""
    if not errors:
        return {"rows": 0}
    geo = math.exp(statistics.fmean(abs(math.log1p(e)) for e in errors)) - 1
    return {"rows": len(errors), "median_abs_rel_error": statistics.median(abs(e) for e in errors),
            "geomean_abs_rel_error": geo, "median_rel_error": statistics.median(errors)}


def _group(records, key, field) -> dict:
    groups: dict[str, list[float]] = {}
    for r in records:
        if r[field] != "":
            groups.setdefault(str(r.get(key, "")), []).append(float(r[field]))
    return {k: stats(v) for k, v in sorted(groups.items())}


def _scatter(records, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for field, marker, label in (("sim_value", "o", "simulator"), ("proxy_value", "x", "proxy")):
        for split in SPLITS:
            pts = [(float(r["value"]), float(r[field])) for r in records if r["split"] == split
                   and r[field] != "" and r[field] == r[field] and float(r[field]) > 0]
            if pts:
                ax.scatter([p[0] / p[0] for p in pts], [p[1] / p[0] for p in pts], marker=marker, alpha=0.7,
                           label=f"{label}, {split_label(split, len(pts))}")
    ax.axhline(1.0, color="k", lw=0.8)
    for band in (0.85, 1.15):
        ax.axhline(band, color="grey", lw=0.6, ls="--")
    ax.set_yscale("log")
    ax.set_xticks([])
    ax.set_ylabel("predicted / measured")
    ax.set_title("predicted / measured per row (dashed: +-15%)")
    # spread the points horizontally by row so they can be told apart
    for coll in ax.collections:
        offsets = coll.get_offsets()
        offsets[:, 0] = range(len(offsets))
        coll.set_offsets(offsets)
    ax.set_xlim(-1, max(len(records), 1))
    ax.set_xlabel("row")
    if ax.collections:
        ax.legend()
    save_figure(fig, path, dpi=120)


def _by_split(used) -> dict:
    """Per split: simulator and proxy over all rows, and the simulator on static rows (long output:
    ``output_len >= 1024``), each with its row count."""
    out = {}
    for split in SPLITS:
        rows = [r for r in used if r["split"] == split]
        if not rows:
            continue
        static = [r for r in rows if r.get("scenario") == "static" and r["rel_error"] != ""]
        long_out = [r for r in static if float(r.get("output_len") or 0) >= 1024]
        out[split] = {"label": split_label(split, len(rows)),
                      "simulator": stats([float(r["rel_error"]) for r in rows if r["rel_error"] != ""]),
                      "proxy": stats([float(r["proxy_rel_error"]) for r in rows]),
                      "simulator_static": stats([float(r["rel_error"]) for r in static]),
                      "simulator_static_long_output": stats([float(r["rel_error"]) for r in long_out]),
                      "simulator_by_scenario": _group(rows, "scenario", "rel_error")}
    return out


def write_outputs(records, header, unknown, out: Path, data_path) -> dict:
    """Write rows.csv, summary.json, scatter.png and report.md into ``out``; print and return the summary."""
    columns = list(header) + [c for c in _EXTRA if c not in header]
    write_csv(out / "rows.csv", columns, records)
    used = [r for r in records if not r["skipped_reason"]]
    sim_err = [float(r["rel_error"]) for r in used if r["rel_error"] != ""]
    proxy_err = [float(r["proxy_rel_error"]) for r in used if r["proxy_rel_error"] != ""]
    summary = {
        "study": "inference", "data": str(data_path), "rows_total": len(records), "rows_used": len(used),
        "rows_skipped": len(records) - len(used), "unknown_columns": unknown,
        "splits": sorted({r["split"] for r in used}),
        "by_split": _by_split(used),
        "simulator": stats(sim_err), "proxy": stats(proxy_err),
        "simulator_by_model": _group(used, "model", "rel_error"),
        "simulator_by_scenario": _group(used, "scenario", "rel_error"),
        "proxy_by_model": _group(used, "model", "proxy_rel_error"),
        "skipped": [{"line": r["line"], "reason": r["skipped_reason"]} for r in records if r["skipped_reason"]],
    }
    atomic_write_json(out / "summary.json", summary)
    _scatter(used, out / "scatter.png")
    atomic_write_text(out / "report.md", _markdown(summary, used))
    for figures in summary["by_split"].values():
        static, long_out = figures["simulator_static"], figures["simulator_static_long_output"]
        print(f"inference {figures['label']}: simulator median |error| {_pct(figures['simulator'])}, proxy "
              f"{_pct(figures['proxy'])}; simulator on static rows {_pct(static)} ({static.get('rows', 0)} rows), "
              f"of which output >= 1024 tokens {_pct(long_out)} ({long_out.get('rows', 0)} rows)")
    return summary


def _pct(figures: dict, key: str = "median_abs_rel_error") -> str:
    return pct(figures.get(key))


def _markdown(summary: dict, used) -> str:
    lines = [f"# Inference study: {summary['data']}", "",
             f"{summary['rows_used']} rows predicted, {summary['rows_skipped']} skipped. A ``fit`` row calibrated a "
             "constant (in sample), a ``test`` row did not (out of sample).", "",
             "| set | predictor | rows | median abs error | geomean abs error | median signed error |",
             "|---|---|---|---|---|---|"]
    for split, figures in sorted(summary["by_split"].items(), key=lambda kv: kv[0] != "test"):
        for name in ("simulator", "proxy", "simulator_static", "simulator_static_long_output"):
            s = figures[name]
            lines.append(f"| {split} | {name.replace('_', ' ')} | {s.get('rows', 0)} | {_pct(s)} | "
                         f"{_pct(s, 'geomean_abs_rel_error')} | {_pct(s, 'median_rel_error')} |")
    for title, key in (("By model (simulator, all sets)", "simulator_by_model"),
                       ("By scenario (simulator, all sets)", "simulator_by_scenario")):
        lines += ["", f"## {title}", "", "| group | rows | median abs error | median signed error |",
                  "|---|---|---|---|"]
        for group, s in summary[key].items():
            lines.append(f"| {group} | {s['rows']} | {_pct(s)} | {_pct(s, 'median_rel_error')} |")
    lines += ["", "## Rows", "", "| line | set | model | scenario | metric | measured | simulator | proxy | error |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in used:
        sim = f"{float(r['sim_value']):.4g}" if r["sim_value"] != "" else "-"
        err = f"{float(r['rel_error']):+.1%}" if r["rel_error"] != "" else "-"
        lines.append(f"| {r['line']} | {r['split']} | {r['model']} | {r['scenario']} | {r['metric']} | {r['value']} | {sim} | "
                     f"{float(r['proxy_value']):.4g} | {err} |")
    if summary["skipped"]:
        lines += ["", "## Skipped", ""] + [f"- line {s['line']}: {s['reason']}" for s in summary["skipped"]]
    return "\n".join(lines) + "\n"
