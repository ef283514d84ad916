"""The report's figures: throughput by topology x model (grouped bars) and the search curves overlaid.

Both write a PNG and return its path, or ``None`` with nothing written when no job has the data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.apps.common import atomic_save_figure
from validation.report.jobs import Job

__all__ = ["throughput_plot", "curves_plot"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cells(jobs: list[Job]) -> dict[tuple[str, str], Job]:
    """The best finished job of each (topology, model) cell."""
    cells: dict[tuple[str, str], Job] = {}
    for job in jobs:
        if job.proxy is None:
            continue
        key = (job.topology or "?", job.model or "?")
        if key not in cells or job.proxy > cells[key].proxy:
            cells[key] = job
    return cells


def _topology_label(topology: str, jobs: list[Job]) -> str:
    """The topology's name over its GPU count(s) (nodes x GPUs per node), so unequal clusters show."""
    sizes = sorted({(j.gpus, j.num_nodes, j.gpus_per_node) for j in jobs if j.gpus}, key=lambda s: s[0])
    if not sizes:
        return topology
    text = ", ".join(f"{g} ({n}x{p})" if n and p else str(g) for g, n, p in sizes)
    return f"{topology}\n{text} GPUs"


def throughput_plot(jobs: list[Job], path: Path) -> Path | None:
    """Bars: best plan's proxy tokens/s/GPU per topology (groups, with their GPU counts) and model (bars);
    diamonds: the simulator's figure; labels: the ratio to Megatron."""
    cells = _cells(jobs)
    if not cells:
        return None
    plt = _pyplot()
    topologies = sorted({t for t, _ in cells})
    models = sorted({m for _, m in cells})
    width = 0.8 / len(models)
    x = np.arange(len(topologies))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(topologies) * max(1, len(models)) ** 0.5), 4.2))
    for i, model in enumerate(models):
        offsets = x - 0.4 + width * (i + 0.5)
        heights = [cells[(t, model)].proxy if (t, model) in cells else np.nan for t in topologies]
        bars = ax.bar(offsets, heights, width, label=model)
        for bar, t in zip(bars, topologies, strict=True):
            job = cells.get((t, model))
            if job is None:
                continue
            if job.sim is not None:
                ax.plot(bar.get_x() + bar.get_width() / 2, job.sim, "kD", markersize=4)
            if job.ratio is not None:
                top = max(bar.get_height(), job.sim or 0.0)
                ax.annotate(f"{job.ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, top), xytext=(0, 5),
                            textcoords="offset points", ha="center", va="bottom", fontsize=7)
    if any(j.sim is not None for j in cells.values()):
        ax.plot([], [], "kD", markersize=4, label="simulator")
    ax.set_xticks(x, [_topology_label(t, [j for (jt, _), j in cells.items() if jt == t]) for t in topologies])
    ax.set_ylabel("best plan, tokens/s/GPU (proxy)")
    ax.margins(y=0.08)
    ax.set_title("Throughput by topology and model (labels: ratio to Megatron)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def curves_plot(jobs: list[Job], path: Path) -> Path | None:
    """Best tokens/s/GPU against proxy calls, one line per job that recorded a curve; divided by the
    job's Megatron baseline when every such job has one (so scenarios share one axis)."""
    with_curves = [j for j in jobs if j.curve is not None]
    if not with_curves:
        return None
    relative = all(j.megatron for j in with_curves)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for job in with_curves:
        label = " / ".join(str(v) for v in (job.topology, job.model, job.planner) if v) or job.name
        best = np.asarray(job.curve.best) / (job.megatron if relative else 1.0)
        ax.step(job.curve.calls, best, where="post", label=label)
    if relative:
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="Megatron")
    ax.set_xlabel("proxy calls")
    ax.set_ylabel("best valid throughput / Megatron" if relative else "best valid tokens/s/GPU")
    ax.set_title("Search curves")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path
