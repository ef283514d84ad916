"""Wide expert parallelism: published multi-node DeepSeek serving on Hopper against the simulator.

``shard-validate study=wide_ep`` (``conf/study/wide_ep.yaml``; data ``validation/data/wide_ep_published.csv``
or any CSV in its schema, :mod:`.rows`) builds each published deployment as a serving plan, simulates the
measured phase under the published load (:mod:`.serve`) and puts the simulator (flows on the topology) and
the proxy (contention off) side by side with the published throughput per node. Where the network decides:
prefill on 4 nodes, decode on 9 and 18, every MoE layer's dispatch and combine crossing InfiniBand.

Sources (fit and test by source, ``validation/data/README.md``): the LMSYS / SGLang deployment on 96 H100
(May 2025; ``fit``: the same source's rows are fit rows of ``inference_calibration.csv``) and DeepSeek's
own inference system on H800 (open-infra-index, day 6; ``test``). Nothing in this study is fitted: the
figures of both splits are predictions from constants set elsewhere, and the split says which source
some fit may have read. Prints a table, writes ``rows.csv`` and ``summary.json`` into the run dir; the
summary's ``rows`` holds every row's figures, ``test`` / ``fit`` the median |error| of each split.
``python -m validation.studies.wide_ep [--data CSV] [--out DIR]`` runs it outside Hydra.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from validation.studies.common import atomic_write_json, pct, write_csv
from validation.studies.common.split import split_label
from validation.studies.wide_ep.rows import WideEpCase, load_cases
from validation.studies.wide_ep.serve import CONTENTION_SWITCH, TBO_SWITCH, deployment_plan, simulate_case

__all__ = ["DATA", "evaluate", "run", "main"]

DATA = Path(__file__).resolve().parents[2] / "data" / "wide_ep_published.csv"
_COLUMNS = ("line", "split", "source", "hardware", "phase", "layout", "load", "measured", "sim", "proxy", "sim_error",
            "proxy_error", "closer", "sim_no_tbo", "sim_no_tbo_error", "itl_p50_ms", "preemptions", "reason")


def _error(value: float | None, measured: float) -> float | None:
    return None if value is None else value / measured - 1.0


def _record(case: WideEpCase) -> dict:
    sim = simulate_case(case, contention=True)
    proxy = simulate_case(case, contention=False) if CONTENTION_SWITCH else sim
    plain = simulate_case(case, overlap=False) if TBO_SWITCH else sim  # a diagnostic, not scored
    s, p = _error(sim["per_node"], case.measured), _error(proxy["per_node"], case.measured)
    closer = None if s is None or p is None else ("tie" if abs(abs(s) - abs(p)) < 5e-4 else
                                                  ("sim" if abs(s) < abs(p) else "proxy"))
    load = (f"{case.tokens_per_gpu_step} tok/GPU/step, ISL {case.input_len}" if case.phase == "prefill" else
            f"{case.batch_per_gpu} seqs/GPU, KV {case.kv_len}")
    return {"line": case.line, "split": case.split, "source": case.source, "hardware": case.hardware,
            "phase": case.phase, "layout": f"{case.nodes}x{case.gpus_per_node} tp{case.tp} ep{case.ep} "
                                            f"+{case.redundant_experts}", "load": load,
            "measured": round(case.measured, 1), "sim": _round(sim["per_node"]), "proxy": _round(proxy["per_node"]),
            "sim_error": _round(s, 4), "proxy_error": _round(p, 4), "closer": closer,
            "sim_no_tbo": _round(plain["per_node"]), "sim_no_tbo_error": _round(_error(plain["per_node"], case.measured), 4),
            "itl_p50_ms": _round(sim.get("itl_p50_ms"), 3), "preemptions": sim.get("preemptions"),
            "reason": sim["reason"]}


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _median_abs(records: list[dict], key: str) -> float | None:
    errors = [abs(r[key]) for r in records if r[key] is not None]
    return round(statistics.median(errors), 4) if errors else None


def evaluate(cases: list[WideEpCase]) -> tuple[list[dict], dict]:
    """Every row's record and, per split, its row count and the median |error| of the sim and the proxy."""
    records = [_record(c) for c in cases]
    by_split = {}
    for split in ("fit", "test"):
        rs = [r for r in records if r["split"] == split]
        if rs:
            by_split[split] = {"label": split_label(split, len(rs)), "rows": len(rs),
                               "sim_median_abs_error": _median_abs(rs, "sim_error"),
                               "proxy_median_abs_error": _median_abs(rs, "proxy_error"),
                               "within_15pct": sum(1 for r in rs if r["sim_error"] is not None
                                                   and abs(r["sim_error"]) <= 0.15)}
    return records, by_split


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _print(records: list[dict], by_split: dict) -> None:
    print(f"{'line':>4} {'split':5} {'hw':8} {'phase':7} {'layout':22} {'load':28} {'measured':>9} {'sim':>9} "
          f"{'err':>7} {'proxy':>9} {'err':>7} {'no TBO':>9} {'err':>7}  closer")
    for r in records:
        print(f"{r['line']:>4} {r['split']:5} {r['hardware']:8} {r['phase']:7} {r['layout']:22} {r['load']:28} "
              f"{_num(r['measured']):>9} {_num(r['sim']):>9} {_signed(r['sim_error']):>7} {_num(r['proxy']):>9} "
              f"{_signed(r['proxy_error']):>7} {_num(r['sim_no_tbo']):>9} {_signed(r['sim_no_tbo_error']):>7}  "
              f"{r['closer'] or r['reason']}")
    for s in by_split.values():
        print(f"{s['label']}: median |error| sim {pct(s['sim_median_abs_error'])}, proxy "
              f"{pct(s['proxy_median_abs_error'])}; {s['within_15pct']} of {s['rows']} within 15%")
    if not CONTENTION_SWITCH:
        print("proxy = sim: this simulate_serving has no contention switch")
    if not TBO_SWITCH:
        print("no TBO = sim: these runtime profiles have no two-batch overlap")


def run(data_path: str | Path, out_dir: str | Path, study=None) -> dict:
    """Simulate every row, print the table, write ``rows.csv`` and ``summary.json`` into ``out_dir``."""
    out = Path(out_dir)
    cases, skipped = load_cases(data_path)
    if not cases:
        raise ValueError(f"data: no usable rows in {data_path} ({len(skipped)} skipped)")
    records, by_split = evaluate(cases)
    _print(records, by_split)
    for line, reason in skipped:
        print(f"skipped line {line}: {reason}")
    plans = {}
    for source in dict.fromkeys(c.source for c in cases):
        own = {c.phase: c for c in cases if c.source == source}
        plans[source] = deployment_plan(own.get("prefill") or own["decode"], own.get("decode")).describe()
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "rows.csv", list(_COLUMNS) + ["skipped"],
              records + [{"line": line, "skipped": reason} for line, reason in skipped])
    summary = {"study": "wide_ep", "data": str(data_path), "rows_used": len(records), "rows_skipped": len(skipped),
               "proxy_is_sim": not CONTENTION_SWITCH, "two_batch_overlap": TBO_SWITCH, "plans": plans,
               "rows": {f"line {r['line']} {r['phase']} {r['hardware']}": {k: r[k] for k in (
                   "split", "measured", "sim", "proxy", "sim_error", "proxy_error")} for r in records},
               **by_split}
    atomic_write_json(out / "summary.json", summary)
    return summary


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--out", default="outputs/wide_ep")
    args = ap.parse_args(argv)
    return run(args.data, args.out)
