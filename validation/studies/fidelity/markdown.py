"""``report.md`` of the fidelity study."""

from __future__ import annotations

from validation.studies.fidelity.regimes import REGIMES, THRESHOLDS

__all__ = ["markdown", "describe"]

_TOP = 10
_CAUSE_TEXT = {
    "overlap": "the simulator hides communication under compute (one microbatch's collectives under another's "
               "kernels, shared experts beside an MoE dispatch); the proxy adds every collective to the step",
    "contention": "collectives and pipeline sends share NVLink/NIC links in the simulator; the proxy prices each "
                  "on an idle fabric",
    "pipeline_wait": "the critical stage waits longer for its neighbours (sends, microbatch hand-offs, "
                     "a busy communication stream) than the proxy's closed-form bubble",
    "pipeline_overlap": "stages overlap their microbatches better than the closed-form bubble assumes",
    "compute_slower": "compute kernels take longer (hot expert ranks under skewed routing)",
    "compute_faster": "a decode step's first kernels run under the previous step's last collectives, before the "
                      "measured period (overlap across steps)",
}


def _f(value, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def describe(r: dict) -> str:
    """A strategy row in one line: its degrees, then its non-Megatron sharding in brackets."""
    text = f"tp{r['tp']} ep{r['ep']} pp{r['pp']} dp{r['dp']} b{r['batch']} mb{r['microbatches']}"
    return text if r["sharding"] == "megatron" else f"{text} [{r['sharding']}]"


def _headline(summary: dict) -> list[str]:
    lines = ["| scenario | strategies | Kendall tau | Spearman | tau, proxy top 50 | top-10 overlap | "
             "median sim/proxy | p10-p90 | abs(ratio-1) > 5% | sim-invalid | wall |", "|---" * 11 + "|"]
    for name, s in summary["scenarios"].items():
        r = s["ratio"]
        if not s["strategies"]:
            lines.append(f"| {name} | 0 (every simulation failed) |" + " - |" * 9)
            continue
        lines.append(f"| {name} | {s['strategies']} | {_f(s['kendall_tau'])} | {_f(s['spearman'])} | "
                     f"{_f(s['top50']['kendall_tau'])} | {s['top10']['overlap']}/{s['top10']['k']} | "
                     f"{_f(r.get('median'))} | {_f(r.get('p10'))}-{_f(r.get('p90'))} | "
                     f"{_f(r.get('share_large'), '.0%')} | {s['sim_invalid']} | {s['wall_s']:.0f} s |")
    return lines


def _regimes(summary: dict) -> list[str]:
    names = list(summary["scenarios"])
    lines = ["| regime | all scenarios: n, median, p10-p90, >5% | " + " | ".join(names) + " |",
             "|---" * (len(names) + 2) + "|"]
    for g in REGIMES:
        if g not in summary["regimes"]:
            continue
        p = summary["regimes"][g]
        cells = [f"{p['n']}, {p['median']:.3f}, {p['p10']:.3f}-{p['p90']:.3f}, {p['share_large']:.0%}"]
        for n in names:
            s = summary["scenarios"][n].get("regimes", {}).get(g)
            cells.append(f"{s['n']}: {s['median']:.3f}" if s else "-")
        lines.append(f"| {g.replace('_', ' ')} | " + " | ".join(cells) + " |")
    return lines


def _rerank(summary: dict) -> list[str]:
    lines = ["| scenario | pool (size) | proxy's pick | re-ranked pick | changed | sim gain | proxy's view | "
             "regret before -> after |", "|---" * 8 + "|"]
    for name, s in summary["scenarios"].items():
        for pool, r in s["rerank"].items():
            invalid = "" if r["proxy_pick_sim_valid"] else " (misses an SLO in the simulator)"
            lines.append(f"| {name} | {pool} ({r['pool_size']}) | {r['proxy_pick_strategy']}{invalid} | "
                         f"{r['reranked_pick_strategy']} | {'yes' if r['changed'] else 'no'} | "
                         f"{_f(r['gain'], '+.2%')} | {_f(r['proxy_loss'], '+.2%')} | "
                         f"{_f(r['regret_proxy_pick'], '.2%')} -> {_f(r['regret_reranked_pick'], '.2%')} |")
    return lines


def _disagreements(name: str, s: dict, rows: list[dict]) -> list[str]:
    lines = [f"### {name}: {s['large_disagreements']} of {s['strategies']} beyond 5%", ""]
    if not s["large_disagreements"]:
        return lines + ["None: every simulated step is within 5% of the proxy's.", ""]
    lines += ["| dominant cause | n | median ratio | primary regimes | mechanism |", "|---|---|---|---|---|"]
    for cause, c in s["causes"].items():
        regimes = ", ".join(f"{g.replace('_', ' ')} {k}" for g, k in c["regimes"].items())
        lines.append(f"| {cause.replace('_', ' ')} | {c['n']} | {c['median_ratio']:.3f} | {regimes} | "
                     f"{_CAUSE_TEXT[cause]} |")
    worst = sorted((r for r in rows if r["scenario"] == name and r["large"]), key=lambda r: -abs(r["ratio"] - 1))
    lines += ["", f"The {min(_TOP, len(worst))} largest (ms per step of the proxy's critical stage; proxy: compute / "
              "comm / bubble, simulator: compute / exposed comm / bubble / idle):", "",
              "| strategy | regime | ratio | proxy | simulator | busiest link | why | overlap vs contention |",
              "|---|---|---|---|---|---|---|---|"]
    for r in worst[:_TOP]:
        split = " / ".join(f"{r[f'sim_{k}_ms']:.2f}" for k in ("compute", "exposed_comm", "bubble", "idle"))
        prox = " / ".join(f"{r[f'proxy_{k}_ms']:.2f}" for k in ("compute", "comm", "bubble"))
        ov = r["overlap_vs_contention"] or "-"
        if r["overlap_only_ratio"] != "":
            ov = f"contention off: {r['overlap_only_ratio']:.3f}; {ov}"
        lines.append(f"| {describe(r)} | {r['regimes'].replace('|', ', ')} | {r['ratio']:.3f} | {prox} | {split} | "
                     f"{r['max_link_utilization']:.0%} | {r['why']} | {ov} |")
    return lines + [""]


def markdown(summary: dict, rows: list[dict]) -> str:
    st = summary["settings"]
    lines = ["# Fidelity: the simulator against the roofline proxy", "",
             "Produced by `shard-validate study=fidelity` (or `python -m validation.studies.fidelity`). "
             "Each strategy is priced by the proxy and simulated with contention and overlap on; throughput is "
             "tokens/s/GPU, `ratio` is simulator over proxy step time. Strategies per scenario: "
             f"{st['strategies']} ({st['large_strategies']} on scenarios of >= {st['large_gpus']} GPUs, where one "
             f"simulation takes seconds); PPO trajectory budget {st['search_budget']} proposals; seed {st['seed']}. "
             "Kendall tau and Spearman rank every sampled strategy; the top-10 overlap and re-ranking only pick "
             "strategies the simulator also finds valid (it can miss an SLO the proxy meets).",
             "", "## Rank agreement", ""] + _headline(summary) + ["", "Samples:", ""]
    for name, s in summary["scenarios"].items():
        src = ", ".join(f"{k} {v}" for k, v in s.get("sources", {}).items())
        failed = f", {len(s['sim_errors'])} more the simulator failed on" if s["sim_errors"] else ""
        lines.append(f"- {name}: {src}{failed}. Trajectory: {s.get('trajectory', '-')}.")
    th = THRESHOLDS
    lines += ["", "## Error by regime", "",
              "Flags from the proxy's breakdown and the lowered collectives (a strategy has every flag that holds; "
              "its primary regime is the first): bubble heavy = bubble >= "
              f"{th['bubble']:.0%} of the step; all-to-all heavy = `comm:ep` >= {th['all_to_all']:.0%}; inter-node = "
              f"communication on communicators spanning NVLink domains >= {th['inter_node']:.0%}; latency-bound = "
              f"communication >= {th['comm']:.0%} with latency terms >= {th['latency_share']:.0%} of it (small "
              f"messages), bandwidth-bound = the same with latency terms below {th['latency_share']:.0%}; "
              "compute-bound = none of these. Cells: n, median sim/proxy step ratio, p10-p90, share beyond 5%.", ""]
    lines += _regimes(summary) + ["", "![ratios](ratios.png)", "", "## Re-ranking (K = 16)", "",
                                  "The simulator's best valid strategy among the proxy's 16 best, over the whole "
                                  "sample and over each source alone. Gain: simulated throughput of the re-ranked pick "
                                  "over the proxy's pick; regret: shortfall to the best simulated strategy of the pool.",
                                  ""] + _rerank(summary)
    lines += ["", "![scatter](scatter.png)", "", "## Large disagreements (abs(ratio - 1) > 5%)", "",
              "Every one is explained in `strategies.csv` (columns `cause`, `why`) from the difference of the two "
              "breakdowns: both sum to their step time, so simulator minus proxy step = d compute + d comm (exposed "
              "vs all) + d wait (bubble + idle vs bubble), and the largest term is the cause. The largest ones were "
              "simulated again with contention off to split overlap from link sharing.", ""]
    for name, s in summary["scenarios"].items():
        if s["strategies"]:
            lines += _disagreements(name, s, rows)
    failed = [(name, f) for name, s in summary["scenarios"].items() for f in s["sim_errors"]]
    if failed:
        lines += ["## Simulator failures", "", "Left out of every figure above (the simulator raised):", ""]
        lines += [f"- {name}: {f['strategy']} (key {f['key']}): {f['error']}" for name, f in failed]
    return "\n".join(lines) + "\n"
