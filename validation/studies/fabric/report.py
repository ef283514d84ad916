"""The fabric study's tables and plots (:mod:`validation.studies.fabric`)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from simcore.files import atomic_save_figure, pyplot

__all__ = ["markdown", "picks_csv", "plot"]

_COLUMNS = ("case", "fabric", "load", "proxy_pick", "sim_pick", "proxy_pick_proxy_goodput", "proxy_pick_sim_goodput",
            "sim_pick_sim_goodput", "regret", "gain_over_proxy_pick")


def _binding(p: dict, key: str = "binding") -> str:
    b = p.get(key)
    if not b or not b.get("busiest_link"):
        return "-"
    share = b.get("network_wait_share")
    util = b.get("busiest_utilization")
    link = b["busiest_link"]
    tier = "leaf-spine" if "spine" in link else ("NIC" if "nic" in link else "NVLink")
    return (f"{tier} {link}"
            + (f" at {util:.0%}" if isinstance(util, float) else "")
            + (f", {share:.0%} of step on network" if isinstance(share, float) else ""))


def picks_csv(picks: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([*_COLUMNS, "binding", "proxy_pick_binding"])
    for p in picks:
        w.writerow([p[c] for c in _COLUMNS] + [_binding(p), _binding(p, "proxy_pick_binding")])
    return buf.getvalue()


def markdown(picks: list[dict]) -> str:
    lines = ["| case | fabric | clients/GPU | proxy's pick | simulator's pick | goodput of proxy's pick (sim) | "
             "goodput of sim's pick (sim) | gain | binding (sim's pick) | binding (proxy's pick) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in picks:
        lines.append(f"| {p['case']} | {p['fabric']} | {p['load']} | {p['proxy_pick']} | "
                     f"{'same' if p['sim_pick'] == p['proxy_pick'] else p['sim_pick']} | "
                     f"{p['proxy_pick_sim_goodput']:.1f} | {p['sim_pick_sim_goodput']:.1f} | "
                     f"{p['gain_over_proxy_pick']:+.1%} | {_binding(p)} | {_binding(p, 'proxy_pick_binding')} |")
    return "\n".join(lines) + "\n"


def plot(out: Path, case: str, picks: list[dict]) -> Path:
    """Goodput (tokens/s/GPU within the SLOs, simulated) against clients per GPU, one colour per fabric:
    solid the simulator's pick, dashed the proxy's pick."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, fabric in enumerate(sorted({p["fabric"] for p in picks})):
        mine = sorted((p for p in picks if p["fabric"] == fabric), key=lambda p: p["load"])
        loads = [p["load"] for p in mine]
        color = f"C{i}"
        ax.plot(loads, [p["sim_pick_sim_goodput"] for p in mine], "-o", color=color, label=f"{fabric}: simulator's pick")
        ax.plot(loads, [p["proxy_pick_sim_goodput"] for p in mine], "--x", color=color, label=f"{fabric}: proxy's pick")
    ax.set_xlabel("clients per GPU")
    ax.set_ylabel("goodput, output tokens/s/GPU (simulated)")
    ax.set_title(case)
    ax.legend(fontsize=7)
    path = out / f"goodput_{case}.png"
    atomic_save_figure(fig, path)
    plt.close(fig)
    return path
