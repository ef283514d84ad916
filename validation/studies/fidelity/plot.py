"""Plots of the fidelity study: proxy vs simulator throughput per scenario, ratios by regime."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from validation.studies.common import pyplot, save_figure
from validation.studies.fidelity.regimes import REGIMES

__all__ = ["scatter_plot", "ratio_plot"]

_COLORS = dict(zip(REGIMES, ("tab:purple", "tab:red", "tab:orange", "tab:blue", "tab:green", "tab:gray"),
                   strict=True))


def scatter_plot(rows: list[dict], per: dict, path: Path) -> None:
    """One panel per scenario: proxy vs simulated tokens/s/GPU (log-log), coloured by primary regime;
    the proxy's pick (star) and the re-ranked pick (triangle) over the whole sample."""
    plt = pyplot()
    names = list(per)
    cols = min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 4.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        sub = [r for r in rows if r["scenario"] == name]
        x = np.array([r["proxy_tokens_per_s_per_gpu"] for r in sub])
        y = np.array([r["sim_tokens_per_s_per_gpu"] for r in sub])
        for regime in REGIMES:
            m = np.array([r["regime"] == regime for r in sub])
            if m.any():
                ax.scatter(x[m], y[m], s=10, alpha=0.6, color=_COLORS[regime], label=regime.replace("_", " "))
        rec = per[name]["rerank"].get("all")
        if rec:
            ax.scatter(x[rec["proxy_pick"]], y[rec["proxy_pick"]], marker="*", s=160, color="k", label="proxy's pick")
            ax.scatter(x[rec["reranked_pick"]], y[rec["reranked_pick"]], marker="^", s=90, facecolor="none",
                       edgecolor="k", label="re-ranked pick (K=16)")
        lo, hi = float(min(x.min(), y.min())) * 0.8, float(max(x.max(), y.max())) * 1.25
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        tau = per[name]["kendall_tau"]
        ax.set_title(f"{name} (n={len(sub)}, tau={tau:.3f})" if tau is not None else name, fontsize=10)
        ax.set_xlabel("proxy tokens/s/GPU")
        ax.set_ylabel("simulator tokens/s/GPU")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    handles: dict = {}  # one legend for every panel: each regime that occurs anywhere, then the picks
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    order = [r.replace("_", " ") for r in REGIMES] + ["proxy's pick", "re-ranked pick (K=16)"]
    labels = [label for label in order if label in handles]
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save_figure(fig, path, dpi=110, tight=False)


def ratio_plot(rows: list[dict], path: Path, large: float) -> None:
    """Sim/proxy step ratio by regime flag (a strategy counts in every regime it has), boxes over all
    scenarios, points coloured by scenario; dashed lines at ``1 +- large``."""
    plt = pyplot()
    present = [g for g in REGIMES if any(g in r["regimes"].split("|") for r in rows)]
    names = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.6 * max(len(present), 3) + 2, 5))
    data = [[r["ratio"] for r in rows if g in r["regimes"].split("|")] for g in present]
    ax.boxplot(data, positions=range(len(present)), widths=0.55, showfliers=False)
    rng = np.random.default_rng(0)
    cmap = plt.get_cmap("tab10")
    labelled: set[str] = set()
    for j, name in enumerate(names):
        for i, g in enumerate(present):
            vals = [r["ratio"] for r in rows if r["scenario"] == name and g in r["regimes"].split("|")]
            if vals:
                ax.scatter(i + rng.uniform(-0.22, 0.22, len(vals)), vals, s=7, alpha=0.45, color=cmap(j % 10),
                           label=None if name in labelled else name)
                labelled.add(name)
    for level in (1 - large, 1 + large):
        ax.axhline(level, color="grey", ls="--", lw=0.7)
    ax.axhline(1.0, color="k", lw=0.7)
    ax.set_xticks(range(len(present)))
    ax.set_xticklabels([f"{g.replace('_', ' ')}\n(n={len(d)})" for g, d in zip(present, data, strict=True)],
                       fontsize=8)
    ax.set_ylabel("simulator / proxy step time")
    ax.set_title(f"sim/proxy step ratio by regime (dashed: +-{large:.0%})")
    ax.legend(fontsize=7, markerscale=2)
    save_figure(fig, path, dpi=110)
