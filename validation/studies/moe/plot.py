"""The MoE study's figure: DeepEP dispatch and combine error per EP size, fit and test rows apart."""

from __future__ import annotations

from pathlib import Path

from validation.studies.common import pyplot, save_figure

__all__ = ["plot_errors"]


def plot_errors(records: list[dict], path: Path) -> None:
    """Signed error (predicted / measured - 1) over EP size: a panel per mode, dispatch as circles and
    combine as crosses, fit rows (DeepEP README of 2025-02-24) blue, test rows orange."""
    plt = pyplot()
    modes = sorted({r["mode"] for r in records})
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.6), squeeze=False)
    for ax, mode in zip(axes.flat, modes, strict=True):
        for split, color in (("fit", "C0"), ("test", "C1")):
            for op, marker in (("dispatch", "o"), ("combine", "x")):
                pts = sorted((r["ep"], 100 * r["rel_error"]) for r in records
                             if r["mode"] == mode and r["split"] == split and r["op"] == op)
                if pts:
                    ax.semilogx([p[0] for p in pts], [p[1] for p in pts], marker, color=color, base=2,
                                label=f"{split} {op}")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(f"DeepEP {mode.replace('_', '-')} kernels", fontsize=10)
        ax.set_xlabel("EP size (GPUs)", fontsize=9)
        ax.set_ylabel("predicted / measured - 1 (%)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("fit: DeepEP README 2025-02-24 (H800); test: later READMEs (IBGDA normal, NVLink low-latency)",
                 fontsize=9)
    save_figure(fig, path, dpi=100)
