"""Outputs of the fidelity study: strategies.csv, summary.json, report.md, scatter.png, ratios.png."""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path

import numpy as np

from validation.studies.common import atomic_write_json, atomic_write_text
from validation.studies.fidelity.explain import CAUSES
from validation.studies.fidelity.markdown import describe, markdown
from validation.studies.fidelity.plot import ratio_plot, scatter_plot
from validation.studies.fidelity.regimes import REGIMES, THRESHOLDS
from validation.studies.fidelity.sample import SOURCES
from validation.studies.fidelity.stats import rank_agreement, ratio_stats, rerank, top_overlap

__all__ = ["write_outputs", "scenario_summary"]


def _rerank_records(rows: list[dict], proxy, sim, valid, k: int) -> dict:
    sources = np.array([r["source"] for r in rows])
    pools = {"all": np.ones(len(rows), bool)} | {s: sources == s for s in SOURCES}
    out = {}
    for pool, mask in pools.items():
        rec = rerank(proxy, sim, valid, mask, k)
        if rec is None:
            continue
        for which in ("proxy_pick", "reranked_pick"):
            r = rows[rec[which]]
            rec |= {f"{which}_strategy": describe(r), f"{which}_proxy": r["proxy_tokens_per_s_per_gpu"],
                    f"{which}_sim": r["sim_tokens_per_s_per_gpu"]}
        out[pool] = rec
    return out


def _causes(large: list[dict]) -> dict:
    out = {}
    for cause in CAUSES:
        group = [r for r in large if r["cause"] == cause]
        if group:
            out[cause] = {"n": len(group), "median_ratio": float(np.median([r["ratio"] for r in group])),
                          "regimes": dict(Counter(r["regime"] for r in group).most_common())}
    return out


def scenario_summary(rows: list[dict], k_rerank: int = 16, large: float = 0.05) -> dict:
    """The figures of one scenario's rows (see :mod:`validation.studies.fidelity`); rows the simulator
    failed on are listed under ``sim_errors`` and left out of every figure."""
    failed = [{"strategy": describe(r), "key": r["key"], "error": r["sim_error"]} for r in rows if r["sim_error"]]
    rows = [r for r in rows if not r["sim_error"]]
    if not rows:
        return {"strategies": 0, "sim_errors": failed, "kendall_tau": None, "spearman": None, "rerank": {},
                "ratio": {"n": 0}, "top10": {"overlap": 0, "k": 0}}
    proxy = np.array([r["proxy_tokens_per_s_per_gpu"] for r in rows], float)
    sim = np.array([r["sim_tokens_per_s_per_gpu"] for r in rows], float)
    valid = np.array([bool(r["sim_valid"]) for r in rows])
    ratios = np.array([r["ratio"] for r in rows], float)
    top50 = np.argsort(-proxy, kind="stable")[:50]
    by_flag = {g: ratio_stats(ratios[[g in r["regimes"].split("|") for r in rows]], large) for g in REGIMES}
    big = [r for r in rows if r["large"]]
    return {"strategies": len(rows), "sources": dict(Counter(r["source"] for r in rows)),
            "trajectory": rows[0]["trajectory"], "sim_invalid": int((~valid).sum()),
            "wall_s": rows[0]["scenario_wall_s"], "sim_wall_s_mean": float(np.mean([r["sim_wall_s"] for r in rows])),
            **rank_agreement(proxy, sim), "top50": rank_agreement(proxy[top50], sim[top50]),
            "top10": top_overlap(proxy, sim, valid, 10), "ratio": ratio_stats(ratios, large),
            "regimes": {g: s for g, s in by_flag.items() if s["n"]},
            "primary_regimes": dict(Counter(r["regime"] for r in rows)),
            "rerank": _rerank_records(rows, proxy, sim, valid, k_rerank),
            "large_disagreements": len(big), "causes": _causes(big), "sim_errors": failed}


def _write_csv(rows: list[dict], path: Path) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    atomic_write_text(path, buf.getvalue())


def write_outputs(rows: list[dict], out: Path, settings: dict) -> dict:
    """Write every output file; return the summary (``headline``: the per-scenario figures)."""
    out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(r["scenario"] for r in rows))
    per = {n: scenario_summary([r for r in rows if r["scenario"] == n], settings["k_rerank"], settings["large"])
           for n in names}
    ok = [r for r in rows if not r["sim_error"]]
    ratios = np.array([r["ratio"] for r in ok], float)
    pooled = {g: ratio_stats(ratios[[g in r["regimes"].split("|") for r in ok]], settings["large"])
              for g in REGIMES}
    changes = [{"scenario": n, "pool": p} | rec for n, s in per.items() for p, rec in s["rerank"].items()
               if rec["changed"]]
    headline = {n: {"strategies": s["strategies"], "kendall_tau": s["kendall_tau"], "spearman": s["spearman"],
                    "top10_overlap": s["top10"]["overlap"], "median_ratio": s["ratio"].get("median"),
                    "rerank_gain_all": s["rerank"].get("all", {}).get("gain")} for n, s in per.items()}
    summary = {"study": "fidelity", "settings": {k: (list(v) if isinstance(v, tuple) else v)
                                                 for k, v in settings.items()},
               "engine": "simulator with contention and overlap on; proxy = roofline closed form",
               "regime_thresholds": THRESHOLDS, "scenarios": per,
               "regimes": {g: s for g, s in pooled.items() if s["n"]}, "rerank_changes": changes,
               "headline": headline}
    atomic_write_json(out / "summary.json", summary)
    _write_csv(rows, out / "strategies.csv")
    scatter_plot(ok, {n: s for n, s in per.items() if s["strategies"]}, out / "scatter.png")
    ratio_plot(ok, out / "ratios.png", settings["large"])
    atomic_write_text(out / "report.md", markdown(summary, rows))
    return summary
