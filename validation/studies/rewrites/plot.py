"""``crossover.png``: rewrite / base throughput against batch, one line per topology, one panel per
rewrite (for the scenario, plan and context where that rewrite was measured on the most topologies)."""

from __future__ import annotations

from pathlib import Path

from validation.studies.common import pyplot, save_figure
from validation.studies.rewrites.outcome import outcome

__all__ = ["crossover_plot", "panel_choice"]

_MAX_PANELS = 6
_LABEL_CHARS = 64


def _wins_losses(rows: list[dict]) -> tuple[int, int]:
    kinds = [outcome(r["sim_ratio"]) for r in rows]
    return kinds.count("win"), kinds.count("loss")


def _priority(label: str, rows: list[dict]) -> tuple:
    """Crossovers first, then the paper's FFN2 rewrite, other winners, other singles, combined rewrites."""
    wins, losses = _wins_losses(rows)
    combined = label.startswith("all:")
    rank = 0 if wins and losses and not combined else 1 if "dense_ffn2" in label and not combined else \
        2 if wins and not combined else 4 if combined else 3
    return rank, -len(rows), label


def panel_choice(rows: list[dict]) -> list[tuple[str, str, str, int, list[dict]]]:
    """(rewrite, scenario, plan, context, rows) per panel, most informative first; at most one combined
    (``all:``) rewrite."""
    groups: dict[tuple, list[dict]] = {}
    by_label: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["rewrite"], r["scenario"], r["plan"], r["context"]), []).append(r)
        by_label.setdefault(r["rewrite"], []).append(r)
    best: dict[str, tuple] = {}
    for key, members in groups.items():
        wins, losses = _wins_losses(members)
        score = (bool(wins and losses), len({r["topology"] for r in members}), len(members), -abs(key[3] - 4096))
        if key[0] not in best or score > best[key[0]][0]:
            best[key[0]] = (score, key, members)
    labels = sorted(best, key=lambda label: _priority(label, by_label[label]))
    combined = [label for label in labels if label.startswith("all:")][1:]
    labels = [label for label in labels if label not in combined][:_MAX_PANELS]
    return [(*best[label][1], best[label][2]) for label in labels]


def _short(label: str) -> str:
    return label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 3] + "..."


def crossover_plot(rows: list[dict], path: Path) -> list[dict]:
    """Draw the panels; returns what each shows (for the summary)."""
    plt = pyplot()
    panels = panel_choice(rows)
    cols = 3 if len(panels) > 2 else max(len(panels), 1)
    nrows = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.9 * nrows), squeeze=False)
    shown = []
    for ax, (label, scenario, plan, context, members) in zip(axes.flat, panels, strict=False):
        for i, topo in enumerate(sorted({r["topology"] for r in members})):
            mine = [r for r in members if r["topology"] == topo]
            pts = sorted((r["seqs"], r["sim_ratio"], r["proxy_ratio"]) for r in mine)
            refit = f" (refit tp{mine[0]['tp']} ep{mine[0]['ep']} pp{mine[0]['pp']})" if mine[0]["fit_note"] else ""
            color = f"C{i}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="osD^"[i % 4], color=color, label=topo + refit,
                    lw=3.0 - 0.6 * i, ms=7 - i, alpha=0.8)
            ax.plot([p[0] for p in pts], [p[2] for p in pts], ls=":", color=color, lw=1)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_title(f"{_short(label)}\n{scenario} / {plan}, context {context}", fontsize=8)
        ax.set_xlabel("sequences (decode) or prompts (prefill) per group", fontsize=8)
        ax.set_ylabel("rewrite / base tokens/s/GPU", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
        shown.append({"rewrite": label, "scenario": scenario, "plan": plan, "context": context})
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if not panels:
        axes.flat[0].text(0.5, 0.5, "no rewrite was evaluated", ha="center", va="center")
        axes.flat[0].set_visible(True)
    fig.suptitle("All-gather rewrites: simulator (solid) and proxy (dotted); above 1 the rewrite wins", fontsize=10)
    save_figure(fig, path, dpi=110)
    return shown
