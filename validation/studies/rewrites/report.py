"""Outputs of the rewrites study: cases.csv, summary.json, report.md and crossover.png.

A case *wins* when the rewrite's simulated tokens/s/GPU beats its base plan's by more than
:data:`.outcome.TOL` (relative), *loses* when it trails by more, and ties otherwise. Step-time deltas are
rewrite minus base, per step, in microseconds: negative helps the rewrite.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from pathlib import Path

from validation.studies.common import atomic_write_json, atomic_write_text, write_csv
from validation.studies.rewrites.markdown import markdown
from validation.studies.rewrites.outcome import TERMS, TOL, outcome, why
from validation.studies.rewrites.plot import crossover_plot
from validation.studies.rewrites.terms import collective_table

__all__ = ["summarize", "write_outputs", "headline", "print_summary"]

_COLUMNS = ("scenario", "plan", "base_sharding", "topology", "fit_note", "phase", "context", "seqs", "batch", "tp",
            "ep", "pp", "dp", "microbatches", "rewrite", "direction", "proxy_base_tps", "proxy_rewrite_tps",
            "sim_base_tps", "sim_rewrite_tps", "proxy_ratio", "overlap_ratio", "sim_ratio", "all_reduce_bytes",
            "base_bytes", "rewrite_bytes", "base_launches", "rewrite_launches", "base_alpha_us", "rewrite_alpha_us",
            "base_beta_us", "rewrite_beta_us", "d_alpha_us", "d_beta_us", "d_compute_us", "d_other_us",
            "d_overlap_us", "d_contention_us", "d_step_proxy_us", "d_step_sim_us", "why", "skipped_reason")


def _brief(r: dict | None) -> dict | None:
    if r is None:
        return None
    keys = ("scenario", "plan", "base_sharding", "topology", "fit_note", "rewrite", "direction", "phase", "context",
            "seqs", "batch", "tp", "ep", "pp", "dp", "sim_ratio", "proxy_ratio", "overlap_ratio", "all_reduce_bytes",
            "why")
    return {k: r[k] for k in keys}


def _extremes(rows: list[dict]) -> tuple[dict | None, dict | None]:
    if not rows:
        return None, None
    best, worst = max(rows, key=lambda r: r["sim_ratio"]), min(rows, key=lambda r: r["sim_ratio"])
    return (_brief(best) if outcome(best["sim_ratio"]) == "win" else None,
            _brief(worst) if outcome(worst["sim_ratio"]) == "loss" else None)


def _rates(rows: list[dict]) -> dict:
    sim = Counter(outcome(r["sim_ratio"]) for r in rows)
    proxy = Counter(outcome(r["proxy_ratio"]) for r in rows)
    n = len(rows)
    return {"cases": n, "wins": sim["win"], "losses": sim["loss"], "ties": sim["tie"],
            "win_rate": sim["win"] / n if n else None, "proxy_win_rate": proxy["win"] / n if n else None,
            "median_sim_ratio": statistics.median(r["sim_ratio"] for r in rows) if n else None,
            "best_sim_ratio": max((r["sim_ratio"] for r in rows), default=None),
            "worst_sim_ratio": min((r["sim_ratio"] for r in rows), default=None)}


def _by(rows: list[dict], key: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return dict(sorted(out.items()))


def _span(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def _crossover(rows: list[dict]) -> dict:
    """Per rewrite and topology: the range of all-reduce sizes (nccl-tests bytes) over which it wins and
    over which it loses (simulator)."""
    out: dict = {}
    for label, group in _by(rows, "rewrite").items():
        for topo, cases in _by(group, "topology").items():
            wins = [r["all_reduce_bytes"] for r in cases if outcome(r["sim_ratio"]) == "win"]
            losses = [r["all_reduce_bytes"] for r in cases if outcome(r["sim_ratio"]) == "loss"]
            out.setdefault(label, {})[topo] = {"cases": len(cases), "wins": len(wins), "losses": len(losses),
                                               "win_all_reduce_bytes": _span(wins),
                                               "loss_all_reduce_bytes": _span(losses)}
    return out


def summarize(rows: list[dict], plans: dict, grid, quick: bool) -> dict:
    done = [r for r in rows if not r["skipped_reason"]]
    ar_ag = [r for r in done if r["direction"] == "ar->ag"]
    win, loss = _extremes(done)
    win_fwd, loss_fwd = _extremes(ar_ag)
    agree = sum(outcome(r["proxy_ratio"]) == outcome(r["sim_ratio"]) for r in done)
    return {
        "study": "rewrites", "quick": quick, "scenarios": list(plans), "grid": dataclasses.asdict(grid),
        "planner": "exact optimum under the proxy (planner.exact.exact_optimum): the best any planner can "
                   "return under the proxy, standing in for the PPO planner's plan",
        "tolerance": TOL, "cases": len(rows), "cases_evaluated": len(done), "cases_skipped": len(rows) - len(done),
        "skipped_reasons": dict(Counter(r["skipped_reason"] for r in rows if r["skipped_reason"]).most_common()),
        "largest_win": win, "largest_loss": loss, "largest_win_ar_to_ag": win_fwd, "largest_loss_ar_to_ag": loss_fwd,
        "win_rate_by_topology": {t: _rates(c) for t, c in _by(done, "topology").items()},
        "win_rate_by_topology_ar_to_ag": {t: _rates(c) for t, c in _by(ar_ag, "topology").items()},
        "by_rewrite": {k: _rates(c) | {"direction": c[0]["direction"], **_median_terms(c)}
                       for k, c in _by(done, "rewrite").items()},
        "by_scenario": {k: _rates(c) for k, c in _by(done, "scenario").items()},
        "crossover": _crossover(done),
        "proxy_sim_agreement": agree / len(done) if done else None,
        "collective_costs": collective_table(),
        "plans": plans,
    }


def _median_terms(rows: list[dict]) -> dict:
    return {f"median_{key}": statistics.median(r[key] for r in rows) for _, key in TERMS}


def write_outputs(out: Path, rows: list[dict], plans: dict, grid, quick: bool) -> dict:
    """Write the four files into ``out`` and return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r["why"] = "" if r["skipped_reason"] else why(r)
    write_csv(out / "cases.csv", _COLUMNS, rows)
    summary = summarize(rows, plans, grid, quick)
    atomic_write_json(out / "summary.json", summary)
    summary["crossover_plot"] = crossover_plot([r for r in rows if not r["skipped_reason"]], out / "crossover.png")
    atomic_write_json(out / "summary.json", summary)
    atomic_write_text(out / "report.md", markdown(summary, rows))
    return summary


def _short(b: dict | None) -> dict | None:
    if b is None:
        return None
    return {"sim_ratio": round(b["sim_ratio"], 4), "proxy_ratio": round(b["proxy_ratio"], 4),
            "rewrite": b["rewrite"], "scenario": b["scenario"], "plan": b["plan"], "topology": b["topology"],
            "context": b["context"], "batch": b["batch"], "degrees": f"tp{b['tp']} ep{b['ep']} pp{b['pp']} dp{b['dp']}"}


def headline(summary: dict) -> dict:
    """The figures of the final JSON line."""
    return {"study": "rewrites", "cases": summary["cases_evaluated"], "skipped": summary["cases_skipped"],
            "largest_win": _short(summary["largest_win"]), "largest_loss": _short(summary["largest_loss"]),
            "largest_win_ar_to_ag": _short(summary["largest_win_ar_to_ag"]),
            "largest_loss_ar_to_ag": _short(summary["largest_loss_ar_to_ag"]),
            "win_rate_by_topology": {t: round(v["win_rate"], 3) for t, v in summary["win_rate_by_topology"].items()},
            "proxy_sim_agreement": summary["proxy_sim_agreement"]}


def print_summary(summary: dict) -> None:
    print(f"rewrites study: {summary['cases_evaluated']} cases evaluated, {summary['cases_skipped']} skipped")
    for name in ("largest_win", "largest_loss", "largest_win_ar_to_ag", "largest_loss_ar_to_ag"):
        b = summary[name]
        if b:
            print(f"  {name}: x{b['sim_ratio']:.4f} {b['rewrite']} | {b['scenario']}/{b['plan']} on {b['topology']}, "
                  f"context {b['context']}, batch {b['batch']} | {b['why']}")
    for topo, v in summary["win_rate_by_topology"].items():
        print(f"  {topo}: win rate {v['win_rate']:.1%} ({v['wins']}/{v['cases']}), median ratio "
              f"{v['median_sim_ratio']:.4f}")
