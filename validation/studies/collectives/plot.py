"""The collectives study's figure: measured against simulated bus bandwidth over message size."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from validation.studies.collectives.rows import busbw_factor
from validation.studies.common import pyplot, save_figure, split_kind

__all__ = ["plot_busbw"]


def _panel(r: dict) -> tuple:
    c = r["_case"]
    return (r["split"], c.collective, c.nodes, c.gpus_per_node, c.fabric if c.nodes > 1 else "")


def plot_busbw(records: list[dict], path: Path) -> None:
    """Measured (dots) vs simulated (crosses) busbw over size, a panel per split (fit / test) x collective
    x nodes x GPUs per node (x fabric across nodes), titled with its split, and a colour per requested
    algorithm (``auto`` = NCCL's choice)."""
    plt = pyplot()
    used = [r for r in records if r["skipped_reason"] == ""]
    keys = sorted({_panel(r) for r in used})
    cols = max(1, min(4, len(keys)))
    rows = max(1, math.ceil(len(keys) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        split, coll, nodes, per, fabric = key
        factor = busbw_factor(coll, nodes * per) / 1e9
        panel = [r for r in used if _panel(r) == key]
        for k, algo in enumerate(sorted({r["_case"].algorithm for r in panel})):
            pts = sorted((r for r in panel if r["_case"].algorithm == algo),
                         key=lambda r: r["_case"].size_bytes)
            size = np.array([r["_case"].size_bytes for r in pts])
            measured = size / np.array([r["_case"].measured_time_s for r in pts]) * factor
            simulated = size / np.array([r["_sim_s"] for r in pts]) * factor
            ax.semilogx(size, measured, "o", ms=3, color=f"C{k}", label=f"{algo} measured")
            ax.semilogx(size, simulated, "x-", ms=4, lw=1, color=f"C{k}", label=f"{algo} simulated")
        ax.set_title(f"[{split}: {split_kind(split)}] {coll} {nodes}x{per} {fabric}".rstrip(), fontsize=8)
        ax.set_xlabel("size (bytes)", fontsize=8)
        ax.set_ylabel("busbw (GB/s)", fontsize=8)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    save_figure(fig, path, dpi=100)
