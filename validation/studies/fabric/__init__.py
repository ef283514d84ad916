"""When does the fabric change the plan? ``shard-validate study=fabric [study.quick=true] [study.scenarios=[...]]``.

For each case (:mod:`.cases`: DeepSeek-V3 on SGLang with DeepEP on 4 and 8 H100 nodes, 16 when named;
Llama-3.1-70B on vLLM on 4 nodes) and each fabric (rail-optimized InfiniBand, a 2:1 and a 4:1 oversubscribed fat tree, RoCE,
EFA), every candidate plan is served at each load under the proxy and under the simulator
(:mod:`.compare`); the proxy's pick and the simulator's pick are both judged by the simulator. Writes into
the run dir:

- ``rows.jsonl``: every (case, fabric, load, plan) with both evaluators' figures, appended as each
  (case, fabric) finishes; the same command in the same ``hydra.run.dir`` reads finished ones back
  (each under a fingerprint of its case, fabric, loads and simcore's source: a changed case or
  simulator simulates again);
- ``picks.csv`` and ``fabric.md``: per (case, fabric, load) the two picks, the regret of trusting the
  proxy, and the links that bind the simulator's pick (tier, utilization, share of the step waiting on
  the network);
- ``goodput_<case>.png``: goodput against load per fabric, the simulator's pick beside the proxy's;
- ``summary.json``; the app prints its last line as one JSON line: the largest regret of trusting the
  proxy and where (the gain of the simulator's pick over the proxy's there: ``null`` where the proxy's
  pick meets no SLO in the simulator), how many settings the two picks differ in, and the fabrics on which
  the simulator's pick gains 5% or more.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import simcore
from simcore.files import atomic_write_json, atomic_write_text, dumps
from validation.studies.fabric.cases import CASES, DEFAULT_CASES, FABRICS, QUICK_CASES
from validation.studies.fabric.compare import evaluate_case, pick
from validation.studies.fabric.report import markdown, picks_csv, plot

__all__ = ["run"]


def _cases(names, quick: bool):
    known = {c.name: c for c in CASES}
    names = list(names) if names else list(QUICK_CASES if quick else DEFAULT_CASES)
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown case {bad[0]!r}; choose from {', '.join(known)}")
    return [known[n] for n in names]


def _fingerprint(case, fabric, loads) -> str:
    h = hashlib.sha256(repr((case, fabric, tuple(loads))).encode())
    for path in sorted(Path(simcore.__file__).parent.rglob("*.py")):  # the simulator that priced the block
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _journal(path: Path) -> dict[str, list[dict]]:
    """Finished (case, fabric) blocks of an earlier run in this dir, by fingerprint."""
    if not path.is_file():
        return {}
    blocks = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {b["fingerprint"]: b["rows"] for b in blocks if "fingerprint" in b and "rows" in b}


def run(out: Path, scenarios=None, quick: bool = False, log=print) -> dict:
    cases = _cases(scenarios, quick)
    path = out / "rows.jsonl"
    done = _journal(path)
    rows: list[dict] = []
    for case in cases:
        loads = case.loads[len(case.loads) // 2:][:1] if quick else case.loads
        proxy_memo: dict = {}
        for fabric in FABRICS:
            fp = _fingerprint(case, fabric, loads)
            block = done.get(fp)
            if block is None:
                block = evaluate_case(case, fabric, loads, proxy_memo, log=log)
                with path.open("a") as fh:  # one line per finished block: a crash loses at most the block
                    fh.write(dumps({"fingerprint": fp, "case": case.name, "fabric": fabric.name, "rows": block}) + "\n")
            rows += block
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["case"], r["fabric"], r["load"]), []).append(r)
    picks = [pick(g) for g in groups.values()]
    atomic_write_text(out / "picks.csv", picks_csv(picks))
    atomic_write_text(out / "fabric.md", markdown(picks))
    plots = [str(plot(out, case.name, [p for p in picks if p["case"] == case.name])) for case in cases]
    worst = max(picks, key=lambda p: p["regret"])
    summary = {"study": "fabric", "cases": [c.name for c in cases], "fabrics": [f.name for f in FABRICS],
               "plans_simulated": len(rows), "picks": picks, "plots": plots,
               "largest_regret": {k: worst[k] for k in ("case", "fabric", "load", "proxy_pick", "sim_pick",
                                                        "proxy_pick_sim_goodput", "sim_pick_sim_goodput", "regret",
                                                        "gain_over_proxy_pick")},
               "picks_differ": sum(p["proxy_pick"] != p["sim_pick"] for p in picks), "settings": len(picks),
               "fabrics_with_gain_5pct": ", ".join(sorted({p["fabric"] for p in picks
                                                           if p["gain_over_proxy_pick"] >= 0.05})) or "none"}
    atomic_write_json(out / "summary.json", summary)
    log(markdown(picks))
    return summary
