"""What ``shard-search`` writes and prints besides ``results.json``: the candidates, the curve, tables."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
from rich.table import Table

from planner.actions import OUTSIDE_SPACE
from planner.apps.common import atomic_save_figure, atomic_write_text
from planner.megatron import full_keys
from planner.rerank import Reranked
from planner.runner import SearchResult
from simcore.cost.memory import reason_names
from simcore.files import pyplot
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS
from simcore.strategy.sharding import Strategy, megatron_sharding

__all__ = ["write_candidates", "write_metrics", "plot_curve", "rerank_table", "sharding_diff"]

_DEGREES = ("tp", "ep", "pp", "dp", "batch", "microbatches")


def write_candidates(path: Path, result: SearchResult) -> None:
    """``candidates.csv``: every evaluated strategy in order (degrees, operator choices, redundant
    experts), ``valid`` (1/0), ``invalid_reason`` (``;``-joined names, empty when valid), its proxy
    ``tokens_per_s_per_gpu`` (empty for an invalid plan: sorting the column never puts one first) and
    the best valid so far."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["call", *_DEGREES, *SEARCHABLE_OPS, "redundant_experts", "valid", "invalid_reason",
                     "tokens_per_s_per_gpu", "best_so_far"])
    curve = result.curve()
    n = 6 + len(SEARCHABLE_OPS)
    for i, (key, value, mask) in enumerate(zip(full_keys(result.keys).tolist(), result.values, result.reasons,
                                               strict=True)):
        reasons = OUTSIDE_SPACE if mask < 0 else ";".join(reason_names(int(mask)))
        choices = [CHOICES[c] for c in key[6:n]]
        shown = mask == 0 and not np.isnan(value)
        writer.writerow([i + 1, *key[:6], *choices, key[n], int(mask == 0), reasons,
                         f"{value:.6g}" if shown else "", "" if np.isnan(curve[i]) else f"{curve[i]:.6g}"])
    atomic_write_text(path, buf.getvalue())


def write_metrics(path: Path, metrics: list[dict]) -> None:
    """``metrics.jsonl``: one line per PPO update (NaN written as null)."""
    def clean(v):
        return None if isinstance(v, float) and not np.isfinite(v) else v

    atomic_write_text(path, "".join(json.dumps({k: clean(v) for k, v in m.items()}) + "\n" for m in metrics))


def plot_curve(path: Path, result: SearchResult, title: str, megatron: float | None, exact: float | None) -> None:
    """``search_curve.png``: best-so-far tokens/s/GPU against proxy calls, with reference lines."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    curve = result.curve()
    if len(curve) > 1:
        ax.plot(np.arange(1, len(curve) + 1), curve, label=f"{result.planner} (best so far)")
    elif len(curve) == 1 or np.isfinite(result.best_value):
        ax.plot([result.calls], [result.best_value], "o", label=result.planner)
    for value, label, style in ((megatron, "Megatron heuristic", "--"), (exact, "exact optimum", ":")):
        if value is not None and np.isfinite(value):
            ax.axhline(value, linestyle=style, color="k" if style == ":" else "grey", label=f"{label} {value:,.1f}")
    ax.set_xlabel("proxy calls")
    ax.set_ylabel("tokens/s/GPU (proxy)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=110)
    plt.close(fig)


def sharding_diff(strategy: Strategy, ops: tuple[str, ...]) -> str:
    """Operators whose choice differs from Megatron's, e.g. ``expert_ffn2=dim1``, and the redundant
    experts if any (``-`` if none of either)."""
    meg = megatron_sharding()
    diff = [f"{op}={strategy.sharding[op]}" for op in ops if strategy.sharding[op] != meg[op]]
    if strategy.redundant_experts:
        diff.append(f"redundant_experts={strategy.redundant_experts}")
    return ", ".join(diff) if diff else "-"


def rerank_table(reranked: list[Reranked], ops: tuple[str, ...], reranker: str, title: str) -> Table:
    """Proxy ranking next to the re-ranker's, with each plan's departures from Megatron sharding; a plan
    the re-ranker finds invalid has no rank and no throughput, and says why (``valid``, ``invalid_reason``)."""
    table = Table(title=title)
    for col in ("proxy #", f"re-ranked # ({reranker})", "tp", "ep", "pp", "dp", "batch", "mb", "proxy tok/s/GPU",
                f"re-ranked tok/s/GPU ({reranker})", "valid", "invalid_reason", "sharding vs Megatron"):
        table.add_column(col, justify="left" if col.startswith(("sharding", "invalid")) else "right")
    for r in sorted(reranked, key=lambda r: r.proxy_rank):
        s = r.strategy
        rank, proxy, value = ((str(r.rank), f"{r.proxy_tokens_per_s_per_gpu:,.1f}", f"{r.tokens_per_s_per_gpu:,.1f}")
                              if r.valid else ("-", "", ""))
        table.add_row(str(r.proxy_rank), rank, str(s.tp), str(s.ep), str(s.pp), str(s.dp), str(s.batch),
                      str(s.microbatches), proxy, value, "yes" if r.valid else "no", ";".join(r.reasons),
                      sharding_diff(s, ops))
    return table
