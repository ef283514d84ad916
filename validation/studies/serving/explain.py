"""Where a measured serving row's simulated step time goes: ``python -m validation.studies.serving.explain ID ...``.

For each row ``id`` of a CSV in the schema of ``validation/data/serving_h200_measured.csv`` (``--data``,
that file by default), the row is simulated as ``shard-validate study=serving`` simulates it
(:func:`validation.studies.serving.simulate_case`'s run: the harness's clients, lengths and launch flags)
and the run's mean decode step of each pool is split into its parts
(:func:`simcore.serving.breakdown.step_breakdown`: attention, GEMMs, routed experts, the runtime's fixed
MoE time, communication, CUDA-graph replay, and the host's time beside the GPU's), next to the measured
and simulated TPOT. What it is for: setting a profiler trace of the runtime (one decode step at the same
batch) beside the model's, part by part, and seeing which rows are host-bound in the simulator.

``--set FIELD=VALUE[,FIELD=VALUE]`` prices the rows under other runtime-profile values (as
``python -m validation.studies.serving.score --set`` does: a candidate host floor, MoE time per layer, ...);
on fit rows: ``--set`` with ``--split test`` is refused (the test split is a report, never a target).

``--split fit|test`` (instead of ids) explains every row of that set the study simulates (each measurement
once), in ``--jobs`` processes, a line per row as it ends, then a table by model, backend and what sets
the pace of the mean decode step (the GPU or the host): rows, median |TPOT error|, median signed error,
rows within 10%. Its JSON line: ``{"split", "rows", "host_bound", "groups": {label: {...}}}``.

An unknown id, a missing file, a bad ``--set`` or a row the study skips is one line on stderr, exit 2.
Ends with one JSON line: ``{id: {"measured_tpot_ms", "sim_tpot_ms", "set", "steps": {role: breakdown}}}``.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from planner.apps.serve import decode_step_breakdowns
from simcore.files import dumps
from simcore.serving import get_runtime, simulate_serving
from simcore.serving.breakdown import PARTS
from validation.studies.common.cli import BadInput, OneLineParser, run_script
from validation.studies.serving import case_runtime, duplicates, load_cases, serving_config, split_of
from validation.studies.serving.mapping import map_row
from validation.studies.serving.score import parse_set

__all__ = ["explain", "main"]

_DATA = Path(__file__).resolve().parents[2] / "data" / "serving_h200_measured.csv"


def explain(case, overrides: dict | None = None) -> dict:
    """One mapped row (:class:`~validation.studies.serving.mapping.RowCase`): its measured and simulated
    TPOT and each pool's mean decode step (``to_ms_dict``), by role; ``overrides``: runtime-profile
    values to price it under instead of its backend's."""
    if case.skip:
        raise BadInput(f"id {case.row.get('id', '')}: the study skips this row ({case.skip})")
    try:
        runtime = case_runtime(case, get_runtime(case.runtime).with_overrides(**(overrides or {})))
    except ValueError as exc:  # a value the profile refuses (ServingInputError), named
        raise BadInput(f"--set: {str(exc).splitlines()[0]}") from None
    result = simulate_serving(case.ctx, case.plan, serving_config(case), runtime=runtime)
    if not result.feasible:
        raise BadInput(f"id {case.row.get('id', '')}: not simulated ({result.reason})")
    steps = decode_step_breakdowns(case.ctx, case.plan, case.plan.runtime_for(runtime), result)
    return {"set": split_of(case.row), "plan": case.plan.describe(), "runtime": runtime.name,
            "measured_tpot_ms": float(case.row["silicon_tpot_ms"]), "sim_tpot_ms": result.metrics.tpot_s["mean"] * 1e3,
            "ttft_ms": _ttft_parts(case, runtime, result.metrics.ttft_s["mean"]),
            "steps": {role: b.to_ms_dict() | {"gpu_busy_share": result.pool_stats[role]["gpu_busy_share"],
                                              "mean_decode_context": result.pool_stats[role]["mean_decode_context"]}
                      for role, b in steps.items()}}


def _ttft_parts(case, runtime, sim_ttft_s: float) -> dict:
    """The mean TTFT in ms as the simulation splits it: the request path's fixed latency and its prompt
    tokenization (at the mean drawn prompt, :meth:`RuntimeProfile.request_path_s`), the rest simulated
    (queueing, waiting for the step in progress, prefill steps), and what the measurement holds beyond
    the simulation (``unexplained``: negative where it simulates longer)."""
    prompt = serving_config(case).input_len.mean
    fixed, tokenize = runtime.request_s * 1e3, runtime.tokenize_s_per_token * prompt * 1e3
    measured, simulated = float(case.row["silicon_ttft_ms"]), sim_ttft_s * 1e3
    return {"measured": measured, "simulated": simulated, "request_fixed": fixed, "tokenization": tokenize,
            "scheduler_and_prefill": simulated - fixed - tokenize, "unexplained": measured - simulated}


def _print(row_id: str, out: dict) -> None:
    print(f"\n{row_id} ({out['set']} set): {out['runtime']}, {out['plan']}")
    print(f"  TPOT measured {out['measured_tpot_ms']:.2f} ms, simulated {out['sim_tpot_ms']:.2f} ms")
    t = out["ttft_ms"]
    print(f"  TTFT measured {t['measured']:.1f} ms, simulated {t['simulated']:.1f} ms: request path "
          f"{t['request_fixed']:.1f} ms + tokenization {t['tokenization']:.1f} ms + scheduler and prefill "
          f"{t['scheduler_and_prefill']:.1f} ms; unexplained {t['unexplained']:+.1f} ms")
    for role, step in out["steps"].items():
        print(f"  {'pool' if role == 'both' else role + ' pool'}: mean decode step of {step['sequences']} "
              f"sequences at {step['mean_decode_context']:,.0f} tokens of context, GPUs busy "
              f"{step['gpu_busy_share']:.0%} of the run")
        for part in PARTS:
            if part in step["parts_ms"]:
                print(f"    {part:22s} {step['parts_ms'][part]:9.3f} ms")
        print(f"    {'GPU time':22s} {step['gpu_ms']:9.3f} ms\n    {'host time':22s} {step['host_ms']:9.3f} ms")
        print(f"    {'step':22s} {step['step_ms']:9.3f} ms ({step['bound']} sets it)")


def _explain_row(args) -> tuple[str, dict | None, str]:
    """``explain`` of one CSV row in a worker process (rows pickle; mapped cases need not): its id, the
    answer or ``None``, and why not."""
    row, overrides = args
    try:
        return row.get("id", ""), explain(map_row(row), overrides), ""
    except BadInput as exc:
        return row.get("id", ""), None, str(exc)


def census(cases, split: str, overrides: dict, jobs: int) -> dict:
    """Every ``split`` row the study simulates, explained (module doc); returns the JSON line's dict."""
    rows = [c.row for c, d in zip(cases, duplicates(cases), strict=True)
            if not d and not c.skip and split_of(c.row) == split]
    groups: dict[str, list[float]] = {}
    host = 0
    with ProcessPoolExecutor(jobs) as pool:
        futures = {pool.submit(_explain_row, (r, overrides)): r for r in rows}
        for future in as_completed(futures):
            row = futures[future]
            row_id, out, why = future.result()
            if out is None:
                print(f"{row_id}: {why}")
                continue
            role, step = next(iter(out["steps"].items())) if out["steps"] else ("", {"bound": "none"})
            error = out["sim_tpot_ms"] / out["measured_tpot_ms"] - 1
            host += step["bound"] == "host"
            label = f"{row['model_path'].split('/')[-1]} {row['backend']} {step['bound']}-bound"
            groups.setdefault(label, []).append(error)
            print(f"{row_id}: {out['plan']}, TPOT {out['measured_tpot_ms']:.2f} -> {out['sim_tpot_ms']:.2f} ms "
                  f"({error:+.1%}), {step['bound']} sets the mean decode step")
    summary = {}
    print(f"\n{split} set, by what sets the pace of the mean decode step")
    print(f"{'':52s} {'rows':>5s} {'|TPOT err|':>11s} {'TPOT err':>9s} {'<=10%':>6s}")
    for label, errors in sorted(groups.items()):
        e = np.asarray(errors)
        summary[label] = {"rows": len(e), "median_abs_tpot_error": float(np.median(np.abs(e))),
                          "median_signed_tpot_error": float(np.median(e)), "within_10pct": int(np.sum(np.abs(e) <= 0.1))}
        g = summary[label]
        print(f"{label:52s} {g['rows']:5d} {g['median_abs_tpot_error']:11.1%} {g['median_signed_tpot_error']:+9.1%} "
              f"{g['within_10pct']:6d}")
    return {"split": split, "rows": sum(len(v) for v in groups.values()), "host_bound": host, "groups": summary}


def main(argv=None) -> dict:
    parser = OneLineParser(description="Split a measured serving row's simulated decode step into "
                                                 "its parts (module doc).")
    parser.add_argument("ids", nargs="*", help="row ids (the CSV's id column)")
    parser.add_argument("--split", choices=("fit", "test"), help="every row of this set instead of ids")
    parser.add_argument("--jobs", type=int, default=2, help="processes for --split (>= 1)")
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--set", metavar="FIELD=VALUE[,FIELD=VALUE]", default="",
                        help="runtime-profile values to price the rows under (module doc)")
    args = parser.parse_args(argv)
    overrides = parse_set(args.set) if args.set else {}  # a bad one is its one line, exit 2
    if bool(args.ids) == bool(args.split):
        raise BadInput("give row ids or --split, one of the two")
    if args.jobs < 1:
        raise BadInput(f"--jobs must be >= 1, got {args.jobs}")
    if overrides and args.split == "test":
        raise BadInput("--set with --split test: candidate values are priced on fit rows only; the test split is "
                       "a report, never a target (explain it without --set)")

    if not args.data.is_file():
        raise BadInput(f"--data {args.data}: no such file")
    try:
        loaded = load_cases(args.data)
    except ValueError as exc:
        raise BadInput(str(exc).splitlines()[0]) from None
    if args.split:
        result = census(loaded, args.split, overrides, args.jobs)
        print(dumps(result))
        return result
    cases = {c.row.get("id", ""): c for c in loaded}
    missing = [i for i in args.ids if i not in cases]
    if missing:
        raise BadInput(f"id: {', '.join(missing)} not in {args.data}")
    result = {}
    for row_id in args.ids:
        result[row_id] = explain(cases[row_id], overrides)
        _print(row_id, result[row_id])
    print(dumps(result))
    return result


if __name__ == "__main__":
    run_script(main)
