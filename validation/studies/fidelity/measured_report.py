"""Summary and report section of the three-way fidelity (:mod:`.measured`).

:func:`summarize` counts, per regime and split, the rows, the median |error| of proxy and simulator
against the measurement, the rows where the two differ by more than 5%, and which of the two is
closer there, with the causes named. :func:`write_section` puts the section into a ``report.md``
between two markers, replacing an earlier one, so the fidelity study's own report keeps its text.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from validation.studies.common import atomic_write_text, pct

__all__ = ["BEGIN", "END", "summarize", "section", "write_section"]

BEGIN = "<!-- three-way fidelity: begin (python -m validation.studies.fidelity.measured) -->"
END = "<!-- three-way fidelity: end -->"
REGIMES = ("collectives", "deepep", "inference")


def _median_abs(values: list[float]) -> float | None:
    return round(statistics.median(abs(v) for v in values), 4) if values else None


def _group(rows: list[dict]) -> dict:
    differ = [r for r in rows if r["differ"]]
    out = {"rows": len(rows), "proxy_median_abs_error": _median_abs([r["proxy_rel_error"] for r in rows]),
           "sim_median_abs_error": _median_abs([r["sim_rel_error"] for r in rows]),
           "differ": len(differ), "sim_closer": sum(r["closer"] == "simulator" for r in differ),
           "proxy_closer": sum(r["closer"] == "proxy" for r in differ),
           "causes": dict(Counter(r["cause"] for r in differ).most_common())}
    alt = [r for r in rows if r.get("sim_deepep_rel_error") not in (None, "")]
    if alt:
        out["sim_deepep_median_abs_error"] = _median_abs([r["sim_deepep_rel_error"] for r in alt])
        out["sim_vs_sim_deepep_max_abs"] = round(max(abs(r["sim"] / r["sim_deepep"] - 1) for r in alt), 4)
    return out


def summarize(rows: list[dict]) -> dict:
    """Per regime, per split and pooled: see the module doc. ``headline``: the pooled counts."""
    per = {}
    for regime in REGIMES:
        mine = [r for r in rows if r["regime"] == regime]
        if mine:
            per[regime] = {"all": _group(mine)} | {s: _group([r for r in mine if r["split"] == s])
                                                   for s in ("fit", "test") if any(r["split"] == s for r in mine)}
    headline = {"study": "fidelity-measured", "rows": len(rows),
                **{f"{g}_{k}": per[g]["all"][k] for g in per for k in ("rows", "differ", "sim_closer", "proxy_closer")},
                **{f"{g}_median_abs_error_proxy_sim": [per[g]["all"]["proxy_median_abs_error"],
                                                       per[g]["all"]["sim_median_abs_error"]] for g in per}}
    if "deepep" in per and "sim_deepep_median_abs_error" in per["deepep"]["all"]:
        headline["deepep_median_abs_error_deepep_on_sim_draw"] = per["deepep"]["all"]["sim_deepep_median_abs_error"]
    return {"regimes": per, "headline": headline}


def section(summary: dict, rows: list[dict], worst: int = 12) -> str:
    """The report section (markdown)."""
    lines = [BEGIN, "## Proxy, simulator and measurement (three-way)", "",
             "Every measured row priced by the proxy's closed form and by the simulator "
             "(`python -m validation.studies.fidelity.measured`; rows and causes in `measured.csv`). "
             "Error = predicted / measured - 1; *differ*: |sim / proxy - 1| > 5%; there, *closer* says "
             "which of the two is nearer the measurement. `fit` rows calibrated a constant, `test` rows did not.", "",
             "| regime | split | rows | proxy median abs error | simulator median abs error | differ > 5% | "
             "simulator closer | proxy closer | causes |", "|---|---|---|---|---|---|---|---|---|"]
    for regime, groups in summary["regimes"].items():
        for split, g in groups.items():
            causes = ", ".join(f"{c} {n}" for c, n in g["causes"].items()) or "-"
            lines.append(f"| {regime} | {split} | {g['rows']} | {pct(g['proxy_median_abs_error'])} | "
                         f"{pct(g['sim_median_abs_error'])} | {g['differ']} | {g['sim_closer']} | "
                         f"{g['proxy_closer']} | {causes} |")
    lines += ["", *_notes(summary)]
    differ = sorted((r for r in rows if r["differ"]), key=lambda r: -abs(r["sim_over_proxy"]))
    if differ:
        lines += ["", f"Largest departures (of {len(differ)}):", "",
                  "| regime | split | case | metric | measured | proxy err | sim err | sim/proxy - 1 | closer | cause | why |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in differ[:worst]:
            lines.append(f"| {r['regime']} | {r['split']} | {r['case']} | {r['metric']} | {r['measured']:.4g} | "
                         f"{r['proxy_rel_error']:+.1%} | {r['sim_rel_error']:+.1%} | {r['sim_over_proxy']:+.1%} | "
                         f"{r['closer']} | {r['cause']} | {r['why']} |")
    return "\n".join(lines + ["", END]) + "\n"


def _notes(summary: dict) -> list[str]:
    """One sentence per regime on what the counts say (numbers from the summary)."""
    notes, reg = [], summary["regimes"]
    if "collectives" in reg:
        g = reg["collectives"]["all"]
        notes.append(f"- **collectives**: the flow engine departs from the closed form on {g['differ']} of "
                     f"{g['rows']} measured multi-node rows: each row is one collective on an idle fabric, where "
                     "the flow engine is built to equal the closed form; contention only shows with concurrent "
                     "traffic, which no measured row has.")
    if "deepep" in reg:
        g = reg["deepep"]
        alt = ", ".join(f"{s} {pct(g[s].get('sim_deepep_median_abs_error'))}" for s in ("fit", "test") if s in g)
        causes = ", ".join(f"{c} {n}" for c, n in g["all"]["causes"].items()) or "none"
        notes.append(f"- **deepep**: the simulator runs each row's dispatch or combine as the engine does under "
                     f"`sim.routing.a2a=deepep`: DeepEP's kernels (normal or low latency, the row's kernel "
                     f"version) on a seeded sampled routing, as flows on the row's rail-optimized topology. On "
                     f"these idle fabrics the flows end within {pct(g['all']['sim_vs_sim_deepep_max_abs'])} of "
                     f"DeepEP's per-rank formula on the same draw (column `sim_deepep`, median abs error {alt}). "
                     f"It departs from the proxy's closed form (uniform routing) on {g['all']['differ']} of "
                     f"{g['all']['rows']} rows (causes: {causes}; *skew*: the draw's busiest rank moves more "
                     f"than the mean, *flows*: the flows on the topology depart from DeepEP's formula), the "
                     f"simulator closer on {g['all']['sim_closer']} of them and the proxy on "
                     f"{g['all']['proxy_closer']}.")
    if "inference" in reg:
        g = reg["inference"]["all"]
        notes.append(f"- **inference**: simulator and proxy differ on {g['differ']} of {g['rows']} rows; most "
                     "rows are one GPU or one node at TP <= 8 with one pipeline stage, where nothing overlaps or "
                     "contends and the two agree to rounding.")
    return notes


def write_section(path: Path, summary: dict, rows: list[dict]) -> None:
    """Put :func:`section` into ``path`` (created if missing), replacing the one between the markers."""
    text = path.read_text() if path.exists() else ""
    new = section(summary, rows)
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + new.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + new
    atomic_write_text(path, text)
