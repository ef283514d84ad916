"""``report.md`` of the rewrites study: headline, win rates, per-rewrite terms, crossover, plans."""

from __future__ import annotations

import statistics

from validation.studies.common import pct
from validation.studies.rewrites.outcome import TOL, outcome

__all__ = ["markdown"]

_MECHANISM = """\
How to read the terms. Each case prices the base plan and the rewrite with the proxy and the simulator
at one setting. The step-time change (rewrite minus base, per step, on the critical pipeline stage,
negative helps the rewrite) splits exactly into: *latency* (the alpha terms of the collectives the
rewrite changes: NCCL's latency of the entry it picks plus the calibrated launch overhead, times the
launches per step), *bandwidth* (their bytes over algorithm bandwidth plus ring fill), *compute*
(kernels whose shapes or layouts change, e.g. norms on sharded activations, a replicated attention),
*bubble* (the rest of the proxy's change), *overlap* (what the simulator's separate compute and
communication streams change, contention off) and *contention* (what sharing links changes on top).
Bytes are bus bytes per GPU per step of the changed collectives (nccl-tests convention: an all-reduce of
S over n ranks moves 2(n-1)/n S, an all-gather (n-1)/n S).
"""


def _x(v) -> str:
    return "-" if v is None else f"x{v:.4f}"


def _mb(v) -> str:
    return "-" if v is None else f"{v / 2**20:.3g} MiB"


def _range(span) -> str:
    if span is None:
        return "never"
    lo, hi = span
    return f"at {_mb(lo)}" if lo == hi else f"at {_mb(lo)} to {_mb(hi)}"


def _setting(b: dict) -> str:
    fit = f" ({b['fit_note']})" if b["fit_note"] else ""
    return (f"{b['scenario']} / {b['plan']} (tp{b['tp']} ep{b['ep']} pp{b['pp']} dp{b['dp']}{fit}) on "
            f"{b['topology']}, {b['phase']} context {b['context']}, batch {b['batch']}")


def _headline(summary: dict) -> list[str]:
    lines = ["## Headline", ""]
    for key, title in (("largest_win", "Largest win"), ("largest_loss", "Largest loss"),
                       ("largest_win_ar_to_ag", "Largest win of an all-reduce -> all-gather rewrite"),
                       ("largest_loss_ar_to_ag", "Largest loss of an all-reduce -> all-gather rewrite")):
        b = summary[key]
        if b is None:
            lines.append(f"- **{title}**: none")
            continue
        lines.append(f"- **{title}**: {_x(b['sim_ratio'])} simulator ({_x(b['proxy_ratio'])} proxy), "
                     f"`{b['rewrite']}` ({b['direction']}) on {_setting(b)}. Why: {b['why']}.")
    agree = summary["proxy_sim_agreement"]
    lines += ["", f"Proxy and simulator agree on win / loss / tie in {pct(agree)} of the cases.", ""]
    return lines


def _in_short(summary: dict, rows: list[dict]) -> list[str]:
    lines = ["## In short", ""]
    for direction, name in (("ar->ag", "all-reduce -> all-gather"), ("ag->ar", "all-gather -> all-reduce")):
        mine = [r for r in rows if r["direction"] == direction]
        if not mine:
            continue
        wins = sum(outcome(r["sim_ratio"]) == "win" for r in mine)
        med = statistics.median(r["sim_ratio"] for r in mine)
        lines.append(f"- {name} rewrites win {wins} of {len(mine)} cases ({wins / len(mine):.1%}); median ratio {_x(med)}.")
    ranked = sorted(((v["win_rate"], label, v) for label, v in summary["by_rewrite"].items() if v["wins"]),
                    key=lambda t: (-t[0], t[1]))
    for rate, label, v in ranked[:6]:
        lines.append(f"- `{label}` ({v['direction']}) wins {v['wins']}/{v['cases']} ({rate:.0%}), best "
                     f"{_x(v['best_sim_ratio'])}, median {_x(v['median_sim_ratio'])}.")
    never = [label for label, v in summary["by_rewrite"].items() if not v["wins"]]
    if never:
        lines.append(f"- Never win: {', '.join(f'`{n}`' for n in never)}.")
    return lines + [""]


def _rate_table(title: str, rates: dict) -> list[str]:
    lines = [f"## {title}", "", "| | cases | wins | losses | ties | win rate (simulator) | win rate (proxy) | "
             "median ratio | best | worst |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, v in rates.items():
        lines.append(f"| {name} | {v['cases']} | {v['wins']} | {v['losses']} | {v['ties']} | {pct(v['win_rate'])} | "
                     f"{pct(v['proxy_win_rate'])} | {_x(v['median_sim_ratio'])} | {_x(v['best_sim_ratio'])} | "
                     f"{_x(v['worst_sim_ratio'])} |")
    return lines + [""]


def _per_launch(rows: list[dict], side: str) -> float | None:
    vals = [r[f"{side}_alpha_us"] / r[f"{side}_launches"] for r in rows if r[f"{side}_launches"] > 0]
    return statistics.median(vals) if vals else None


def _rewrite_table(summary: dict, rows: list[dict]) -> list[str]:
    lines = ["## By rewrite: where the step time goes", "",
             "Medians over the rewrite's cases; deltas in microseconds per step (negative helps the rewrite).", "",
             "| rewrite | dir | cases | win rate | median ratio | launches | alpha/launch us | MB/GPU/step | "
             "latency | bandwidth | compute | bubble | overlap | contention |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, v in summary["by_rewrite"].items():
        mine = [r for r in rows if r["rewrite"] == label]

        def med(key, mine=mine):
            return statistics.median(r[key] for r in mine)

        a_b, a_r = _per_launch(mine, "base"), _per_launch(mine, "rewrite")
        alpha = f"{a_b:.1f} -> {a_r:.1f}" if a_b is not None and a_r is not None else "-"
        lines.append(
            f"| `{label}` | {v['direction']} | {v['cases']} | {pct(v['win_rate'])} | {_x(v['median_sim_ratio'])} | "
            f"{med('base_launches'):.0f} -> {med('rewrite_launches'):.0f} | {alpha} | "
            f"{med('base_bytes') / 1e6:.3g} -> {med('rewrite_bytes') / 1e6:.3g} | {v['median_d_alpha_us']:+.1f} | "
            f"{v['median_d_beta_us']:+.1f} | {v['median_d_compute_us']:+.1f} | {v['median_d_other_us']:+.1f} | "
            f"{v['median_d_overlap_us']:+.1f} | {v['median_d_contention_us']:+.1f} |")
    return lines + [""]


def _why(summary: dict, rows: list[dict]) -> list[str]:
    """Per rewrite, the term that decides it most often, with the numbers."""
    lines = ["## Why", "", _MECHANISM]
    names = {"d_alpha_us": "latency", "d_beta_us": "bandwidth", "d_compute_us": "compute", "d_other_us": "bubble",
             "d_overlap_us": "overlap", "d_contention_us": "contention"}
    for label, v in summary["by_rewrite"].items():
        mine = [r for r in rows if r["rewrite"] == label]
        decider: dict[str, int] = {}
        for r in mine:
            key = max(names, key=lambda k, r=r: abs(r[k]))
            decider[names[key]] = decider.get(names[key], 0) + 1
        top = sorted(decider.items(), key=lambda kv: -kv[1])
        share = ", ".join(f"{n} in {c}/{len(mine)}" for n, c in top)
        sizes = [r["all_reduce_bytes"] for r in mine if r["all_reduce_bytes"] > 0]
        span = f"; all-reduce sizes {_mb(min(sizes))} to {_mb(max(sizes))}" if sizes else ""
        lines.append(f"- `{label}` ({v['direction']}): wins {v['wins']}/{v['cases']}, median {_x(v['median_sim_ratio'])}; "
                     f"the largest term is {share}{span}.")
    contention = [r for r in rows if abs(r["d_contention_us"]) >= 0.5]
    overlap = [r for r in rows if abs(r["d_overlap_us"]) >= 0.5]
    lines += ["", f"Contention moves the step-time difference by at least 0.5 us in {len(contention)} of {len(rows)} "
              f"cases, overlap in {len(overlap)}."]
    if contention:
        c = max(contention, key=lambda r: abs(r["d_contention_us"]))
        lines.append(f"The largest contention term is {c['d_contention_us']:+.1f} us (`{c['rewrite']}`, {_setting(c)}).")
    if overlap:
        o = max(overlap, key=lambda r: abs(r["d_overlap_us"]))
        lines.append(f"The largest overlap term is {o['d_overlap_us']:+.1f} us (`{o['rewrite']}`, {_setting(o)}).")
    return lines + [""]


def _costs(summary: dict) -> list[str]:
    lines = ["## Collective costs behind the terms", "",
             "One all-reduce against one all-gather of the same nccl-tests size on the TP groups of the study, "
             "as the cost model prices them (the entry NCCL's tuner picks; alpha = its latency plus the calibrated "
             "launch overhead). A rewrite that swaps one for the other gains the difference; one that adds a "
             "launch pays a whole alpha again.", "",
             "| TP group | size | all-reduce us (alpha, entry) | all-gather us (alpha, entry) | all-gather / all-reduce |",
             "|---|---|---|---|---|"]
    for c in summary["collective_costs"]:
        lines.append(f"| {c['ranks']} GPUs, {c['topology']} | {_mb(c['size_bytes'])} | {c['all_reduce_us']:.1f} "
                     f"({c['all_reduce_alpha_us']:.1f}, {c['all_reduce_algorithm']}) | {c['all_gather_us']:.1f} "
                     f"({c['all_gather_alpha_us']:.1f}, {c['all_gather_algorithm']}) | "
                     f"{c['all_gather_us'] / c['all_reduce_us']:.2f} |")
    return lines + [""]


def _crossover(summary: dict) -> list[str]:
    topos = sorted({t for v in summary["crossover"].values() for t in v})
    lines = ["## Crossover", "",
             "Per rewrite and topology: wins / cases, and the all-reduce sizes (nccl-tests size of the largest "
             "all-reduce the rewrite removes or adds) at which it wins and at which it loses (simulator; "
             "`never` when it does not). `crossover.png` plots the ratio "
             "against batch for one scenario and plan per rewrite.", "",
             "| rewrite | " + " | ".join(topos) + " |", "|---|" + "---|" * len(topos)]
    for label, per in summary["crossover"].items():
        cells = []
        for t in topos:
            c = per.get(t)
            cells.append("-" if c is None else f"{c['wins']}/{c['cases']}; wins {_range(c['win_all_reduce_bytes'])}; "
                                                f"loses {_range(c['loss_all_reduce_bytes'])}")
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    return lines + [""]


def _extreme_rows(rows: list[dict], n: int = 8) -> list[str]:
    lines = []
    for title, sign in (("Largest wins", -1), ("Largest losses", 1)):
        picked = sorted(rows, key=lambda r: sign * r["sim_ratio"])[:n]
        picked = [r for r in picked if outcome(r["sim_ratio"]) == ("win" if sign < 0 else "loss")]
        lines += [f"## {title}", "", "| ratio (sim / proxy) | rewrite | setting | why |", "|---|---|---|---|"]
        lines += [f"| {_x(r['sim_ratio'])} / {_x(r['proxy_ratio'])} | `{r['rewrite']}` | {_setting(r)} | {r['why']} |"
                  for r in picked]
        lines.append("")
    return lines


def _plans(summary: dict) -> list[str]:
    lines = ["## Plans and the rewrites found", "",
             "Collective sizes are nccl-tests sizes at the plan's own batch, per block (layer, first or last stage).",
             ""]
    for scenario, plans in summary["plans"].items():
        shown: set[str] = set()
        lines.append(f"### {scenario}")
        lines.append("")
        for label, p in plans.items():
            s = p["strategy"]
            lines.append(f"- **{label}** ({p['source']}): tp{s['tp']} ep{s['ep']} pp{s['pp']} dp{s['dp']} "
                         f"batch {s['batch']} mb {s['microbatches']}")
            seen: dict[str, list[str]] = {}
            for topo, info in p.get("on", {}).items():
                why_none = (f"none (the plan is invalid there: {', '.join(info['invalid'])})" if info["invalid"]
                            else "none (tp = 1: no TP collective)" if info["degrees"].startswith("tp1 ")
                            else "none")
                found = ", ".join(f"`{r}`" for r in info["rewrites"]) or why_none
                seen.setdefault(found, []).append(topo + (f" ({info['fit_note']})" if info["fit_note"] else ""))
            for found, topos in seen.items():
                lines.append(f"  - rewrites on {'; '.join(topos)}: {found}")
            for label, rw in p.get("rewrites", {}).items():
                if label not in shown:
                    shown.add(label)
                    lines.append(f"  - `{label}` removes {'; '.join(rw['removed'])} and adds {'; '.join(rw['added'])}")
        lines.append("")
    return lines


def markdown(summary: dict, all_rows: list[dict]) -> str:
    rows = [r for r in all_rows if not r["skipped_reason"]]
    g = summary["grid"]
    lines = ["# Rewrites study: all-gathers instead of all-reduces", "",
             f"{summary['cases_evaluated']} cases evaluated ({summary['cases_skipped']} skipped) over scenarios "
             f"{', '.join(summary['scenarios'])}; contexts {g['contexts']}, decode sequences per group "
             f"{g['decode_seqs']}, prefill prompts per group {g['prefill_seqs']}, topologies {', '.join(g['topologies'])}"
             f"{' (quick grid)' if summary['quick'] else ''}. A case wins when the simulator's tokens/s/GPU of the "
             f"rewrite beats its base by more than {TOL:.2%}. The planner's plan is the {summary['planner']}. "
             "SLOs are not applied (equal batch on both sides); cases that do not fit in HBM are skipped.", ""]
    lines += _headline(summary)
    lines += _in_short(summary, rows)
    lines += _rate_table("Win rate by topology (all rewrites)", summary["win_rate_by_topology"])
    lines += _rate_table("Win rate by topology (all-reduce -> all-gather only)", summary["win_rate_by_topology_ar_to_ag"])
    lines += _rate_table("Win rate by scenario", summary["by_scenario"])
    lines += _rewrite_table(summary, rows)
    lines += _why(summary, rows)
    lines += _costs(summary)
    lines += _crossover(summary)
    lines += _extreme_rows(rows)
    lines += _plans(summary)
    if summary["skipped_reasons"]:
        lines += ["## Skipped", ""] + [f"- {n} x {reason}" for reason, n in summary["skipped_reasons"].items()]
    return "\n".join(lines) + "\n"
