"""Throughput against interactivity across loads: the Pareto front, the best plan per SLO, the near misses.

A point is one plan at one load (closed-loop concurrency or Poisson rate): its output tokens/s per GPU
(what the operator pays for) and tokens/s per user (``1 / TPOT``, what a user sees). The front keeps
the points no other point beats on both (:func:`pareto_mask`). The search's best plans of each mode are
simulated at every load of ``serving.search.loads`` (:func:`sweep_loads`), so the front spans the
load range; every plan the search simulated at the configured load joins it.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from planner.serving.evaluator import slo_miss
from simcore.files import atomic_save_figure, atomic_write_text, pyplot
from simcore.serving import ServingConfig, ServingPlan, simulate_serving

__all__ = ["pareto_mask", "point", "sweep_loads", "best_per_slo", "closest_misses", "write_points", "plot_front",
           "POINT_COLUMNS"]

POINT_COLUMNS = ("load", "concurrency", "rate", "mode", "plan", "gpus", "feasible", "tokens_per_s_per_gpu",
                 "tokens_per_s_per_user", "ttft_ms", "tpot_ms", "ttft_p90_ms", "tpot_p90_ms", "goodput",
                 "goodput_tokens_per_s_per_gpu", "meets_slo", "ttft_over_pct", "tpot_over_pct", "on_front")


def pareto_mask(x, y) -> np.ndarray:
    """``bool[n]``: points not dominated (another point at least as good on both and better on one);
    NaNs are never on the front."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    out = np.zeros(len(x), dtype=bool)
    for i in np.flatnonzero(ok):
        dominated = ok & (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        out[i] = not dominated.any()
    return out


def point(result, cfg: ServingConfig, load: float) -> dict:
    """One row of :data:`POINT_COLUMNS` (without ``on_front``) from a simulation."""
    row = {"load": load, "concurrency": cfg.concurrency if cfg.arrival == "closed" else "",
           "rate": cfg.rate if cfg.arrival == "poisson" else "", "mode": result.plan.mode,
           "plan": result.plan.describe(), "gpus": result.plan.gpus, "feasible": result.feasible}
    m = result.metrics
    if m is None:
        return row | {k: math.nan for k in POINT_COLUMNS if k not in row and k != "on_front"} | {"meets_slo": False}
    t1, t2, miss = slo_miss(m.ttft_s["mean"], m.tpot_s["mean"], cfg.ttft_slo_s, cfg.tpot_slo_s)
    return row | {"tokens_per_s_per_gpu": m.output_tokens_per_s_per_gpu, "tokens_per_s_per_user": m.tokens_per_s_per_user,
                  "ttft_ms": m.ttft_s["mean"] * 1e3, "tpot_ms": m.tpot_s["mean"] * 1e3,
                  "ttft_p90_ms": m.ttft_s["p90"] * 1e3, "tpot_p90_ms": m.tpot_s["p90"] * 1e3, "goodput": m.goodput,
                  "goodput_tokens_per_s_per_gpu": m.goodput_tokens_per_s_per_gpu, "meets_slo": miss == 0.0,
                  "ttft_over_pct": 100 * t1, "tpot_over_pct": 100 * t2}


def _scaled(cfg: ServingConfig, load: float) -> ServingConfig:
    if cfg.arrival == "closed":
        c = max(int(round(cfg.concurrency * load)), 1)
        return replace(cfg, concurrency=c, num_requests=max(cfg.num_requests, 2 * c))
    if cfg.arrival == "poisson":
        return replace(cfg, rate=cfg.rate * load)
    return cfg


def sweep_loads(ctx, plans: list[ServingPlan], cfg: ServingConfig, loads, graph=None, runtime=None,
                on_point=None) -> list[dict]:
    """Every plan at every load (``load`` multiplies the concurrency or rate; a trace is replayed once);
    ``on_point(row)`` is called as each simulation ends (a progress bar)."""
    loads = [1.0] if cfg.arrival == "trace" else list(loads)
    rows = []
    for load in loads:
        scaled = _scaled(cfg, float(load))
        for plan in plans:
            rows.append(point(simulate_serving(ctx, plan, scaled, graph=graph, runtime=runtime), scaled, float(load)))
            if on_point is not None:
                on_point(rows[-1])
    return rows


def mark_front(rows: list[dict]) -> list[dict]:
    mask = pareto_mask([r.get("tokens_per_s_per_gpu", math.nan) for r in rows],
                       [r.get("tokens_per_s_per_user", math.nan) for r in rows])
    return [r | {"on_front": bool(m)} for r, m in zip(rows, mask, strict=True)]


def best_per_slo(rows: list[dict], ttft_slo_ms: float | None, tpot_grid_ms) -> list[dict]:
    """For each TPOT target (TTFT at ``ttft_slo_ms``): the point of highest tokens/s/GPU meeting both,
    or, when none does, the closest miss (``met`` False, with how far it misses)."""
    out = []
    for tpot in tpot_grid_ms:
        def misses(r, tpot=tpot):
            return (100 * max(r["ttft_ms"] / ttft_slo_ms - 1, 0) if ttft_slo_ms else 0.0,
                    100 * max(r["tpot_ms"] / tpot - 1, 0))

        ran = [r for r in rows if r["feasible"] and np.isfinite(r.get("tpot_ms", math.nan))]
        met = [r for r in ran if misses(r) == (0.0, 0.0)]
        if met:
            best = max(met, key=lambda r: r["tokens_per_s_per_gpu"])
        elif ran:
            best = min(ran, key=lambda r: max(misses(r)))
        else:
            continue
        t1, t2 = misses(best)
        out.append({"ttft_slo_ms": ttft_slo_ms, "tpot_slo_ms": tpot, "met": bool(met), "plan": best["plan"],
                    "mode": best["mode"], "load": best["load"], "concurrency": best["concurrency"], "rate": best["rate"],
                    "tokens_per_s_per_gpu": best["tokens_per_s_per_gpu"],
                    "tokens_per_s_per_user": best["tokens_per_s_per_user"], "ttft_ms": best["ttft_ms"],
                    "tpot_ms": best["tpot_ms"], "ttft_over_pct": t1, "tpot_over_pct": t2})
    return out


def closest_misses(records, k: int = 3) -> list[dict]:
    """The ``k`` simulated plans that miss the SLOs least (the larger relative miss first), with the
    percentage each mean is over its target. A plan that differs from one already listed only in a
    ``max_num_seqs`` the load never reaches (same layouts and workers, the same simulated TTFT and TPOT)
    is not listed again."""
    ran = [r for r in records if r.feasible]
    ran.sort(key=lambda r: (max(r.ttft_over, r.tpot_over), r.miss))
    out, seen = [], set()
    for r in ran:
        m = r.result.metrics
        same = (re.sub(r", seqs \d+", "", r.plan.describe()), m.ttft_s["mean"], m.tpot_s["mean"])
        if same in seen:
            continue
        seen.add(same)
        out.append({"plan": r.plan.describe(), "mode": r.plan.mode, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
                    "ttft_ms": m.ttft_s["mean"] * 1e3, "tpot_ms": m.tpot_s["mean"] * 1e3,
                    "ttft_over_pct": 100 * r.ttft_over, "tpot_over_pct": 100 * r.tpot_over})
        if len(out) == k:
            break
    return out


def write_points(path: Path, rows: list[dict], columns=POINT_COLUMNS) -> None:

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    atomic_write_text(path, buf.getvalue())


def plot_front(path: Path, rows: list[dict], title: str) -> None:
    """tokens/s/GPU (y) against tokens/s/user (x): every point by mode, the front as a staircase."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for mode, marker, color in (("agg", "o", "tab:blue"), ("disagg", "s", "tab:orange")):
        pts = [r for r in rows if r["mode"] == mode and r["feasible"]]
        if pts:
            ax.scatter([r["tokens_per_s_per_user"] for r in pts], [r["tokens_per_s_per_gpu"] for r in pts],
                       marker=marker, color=color, alpha=0.45, label=f"{mode} ({len(pts)} points)")
    front = sorted((r for r in rows if r.get("on_front")), key=lambda r: r["tokens_per_s_per_user"])
    if front:
        ax.step([r["tokens_per_s_per_user"] for r in front], [r["tokens_per_s_per_gpu"] for r in front], where="post",
                color="black", lw=1.5, label="Pareto front")
        for r in front:
            label = f"c={r['concurrency']}" if r["concurrency"] != "" else f"{r['rate']:g}/s" if r["rate"] != "" else ""
            ax.annotate(f"{label} {r['mode']} {r['gpus']} GPUs", (r["tokens_per_s_per_user"], r["tokens_per_s_per_gpu"]),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("output tokens/s per user (1 / TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)
