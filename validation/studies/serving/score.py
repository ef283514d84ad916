"""Score runtime-profile values on measured serving rows, without the full study.

``python -m validation.studies.serving.score --backend vllm --model Qwen3-235B [--mode agg|disagg] [--split fit]
[--data CSV] [--jobs 2] [--rows] [--set FIELD=VALUE ...] [--set ...]``: the rows of one ``backend`` whose
``model_path`` contains ``--model`` (and whose ``mode`` is ``--mode``, where given; each measurement once,
skipped rows left out, as the study counts them) are simulated as
``shard-validate study=serving`` simulates them (:func:`validation.studies.serving.simulate_case`, the
harness's launch flags included), once with the shipped profiles and once per ``--set`` group (a
comma-separated list of ``RuntimeProfile`` fields, e.g. ``--set moe_memory_efficiency=1.0,moe_layer_s=20e-6``),
each applied on top of the row's own profile. Prints the median |relative error| and the median signed
error of TTFT and TPOT per group (TPOT's signed median also at low load, <= 8 clients, and above), then
one JSON line. ``--rows`` also prints each row of the shipped group: its layout, clients, and measured
against simulated TTFT and TPOT.

Nothing computed is lost: each group's answers are journaled row by row as they end
(:mod:`validation.studies.serving.journal`) under ``--out`` (default ``outputs/score_serving``), in a
directory named by a hash of the group's values, the data file and the code that prices a row. SIGINT or
SIGTERM stops between rows, keeping the rows in flight; the same command again reads every journaled row
back and simulates only the rest, so its figures are those of an uninterrupted run. A changed constant,
data file or cost formula never reuses an old answer (it hashes to another directory).

It is how a candidate constant is tried on the fit rows before any change (the decision rules in the
README): ``--split fit`` is the default and its figures are in sample; ``--split test`` scores test rows
and says so, for the outcome of a change already decided, never to choose one: with ``--set`` it is
refused (one line, exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

from simcore.files import dumps
from simcore.serving import get_runtime
from simcore.serving.runtime import RuntimeProfile
from validation.studies.common.cli import count
from validation.studies.common.split import split_label
from validation.studies.serving import duplicates, load_cases, measurement_key, simulate_case, split_of
from validation.studies.serving.journal import StudyInterrupted, fingerprint, simulate_rows

__all__ = ["main", "parse_set"]

_DATA = Path(__file__).resolve().parents[2] / "data" / "serving_h200_measured.csv"
_FIELDS = {f.name: f for f in dataclasses.fields(RuntimeProfile)}
#: clients at or below which a row counts as low load in the per-load TPOT medians: where a step's fixed
#: costs (host, per-layer kernels) outweigh what grows with the batch, so the split shows which of the two
#: a candidate value moves.
LOW_LOAD_CLIENTS = 8


def _fail(message: str):
    """Bad input: one line on stderr naming what is wrong, exit status 2 (as argparse's own errors)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_set(text: str) -> dict:
    """``"a=1,b=2e-6"`` -> ``{"a": 1.0, "b": 2e-6}``; bad input is :func:`_fail`'s (exit 2)."""
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in _FIELDS or name == "name":
            _fail(f"--set {item!r}: not FIELD=VALUE with FIELD a runtime profile field")
        kind = type(getattr(get_runtime("vllm"), name))
        if kind not in (bool, int, float, str):
            _fail(f"--set {name}: a {kind.__name__} field; only number, flag and name fields can be set here")
        try:
            out[name] = (value.strip().lower() in ("1", "true", "yes")) if kind is bool else kind(value)
        except ValueError:
            _fail(f"--set {name}: {value!r} is not a {kind.__name__}")
    return out


def _one(args):
    case, overrides = args
    return simulate_case(case, get_runtime(case.runtime).with_overrides(**overrides))


def _journal_dir(out: Path, stamp: str, overrides: dict) -> Path:
    """Where one group's journal lives: named by the data and code fingerprint and the group's values."""
    text = json.dumps({"fingerprint": stamp, "set": overrides}, sort_keys=True)
    return out / f"{'set' if overrides else 'shipped'}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _score_group(chosen: list, overrides: dict, args, stamp: str) -> list:
    """Every chosen row simulated under ``overrides``, journaled (module doc); an interrupt is one line
    on stderr saying how to continue, exit 128 + the signal."""
    out = _journal_dir(args.out, stamp, overrides)
    keys = [repr(measurement_key(c.row)) for c in chosen]
    try:
        return simulate_rows([(c, overrides) for c in chosen], keys, _one, args.jobs, out, stamp)
    except StudyInterrupted as exc:
        print(f"interrupted: {exc.done} of {exc.total} rows of group {json.dumps(overrides) if overrides else 'shipped'} "
              f"saved in {exc.path}; the same command continues from there", file=sys.stderr)
        raise SystemExit(128 + int(exc.signal or 2)) from None


def _summary(cases, results) -> dict:
    errs = {"ttft": [], "tpot": []}
    by_load = {"low": [], "high": []}  # signed TPOT errors at <= LOW_LOAD_CLIENTS clients and above
    for case, (ttft, tpot, why) in zip(cases, results, strict=True):
        if why:
            continue
        errs["ttft"].append(ttft * 1e3 / float(case.row["silicon_ttft_ms"]) - 1)
        errs["tpot"].append(tpot * 1e3 / float(case.row["silicon_tpot_ms"]) - 1)
        by_load["low" if case.concurrency <= LOW_LOAD_CLIENTS else "high"].append(errs["tpot"][-1])
    out = {"simulated": len(errs["ttft"])}
    for key, e in errs.items():
        out[f"median_abs_{key}_error"] = float(np.median(np.abs(e))) if e else math.nan
        out[f"median_signed_{key}_error"] = float(np.median(e)) if e else math.nan
    for load, e in by_load.items():
        out[f"median_signed_tpot_error_{load}_load"] = float(np.median(e)) if e else math.nan
    return out


def _layout(row: dict) -> str:
    """A row's layout in one short word: ``tp2 adp- mtp2 mep1``, per pool for a disaggregated row."""
    def pool(prefix: str) -> str:
        return (f"tp{row.get(prefix + 'tp_size') or '-'} adp{row.get(prefix + 'attention_dp_size') or '-'} "
                f"mtp{row.get(prefix + 'moe_tp_size') or '-'} mep{row.get(prefix + 'moe_ep_size') or '-'}")
    if row.get("mode", "").strip() != "disagg":
        return pool("")
    return " + ".join(f"{role[0].upper()} {row.get(role + '_num_workers') or '?'}x({pool(role + '_')})"
                      for role in ("prefill", "decode"))


def _signed(x: float) -> str:
    """A signed share, or ``n/a`` where there were no rows to take it over (nan)."""
    return "n/a" if x != x else f"{x:+.1%}"


def _print_rows(cases, results) -> None:
    """Each row of the shipped group: what it is, and measured against simulated TTFT and TPOT (ms)."""
    print(f"  {'mode':6s} {'isl/osl':>11s} {'clients':>7s}  {'layout':52s} {'TTFT meas/sim':>17s} {'err':>6s} "
          f"{'TPOT meas/sim':>15s} {'err':>6s}")
    for case, (ttft, tpot, why) in zip(cases, results, strict=True):
        r = case.row
        head = f"  {r.get('mode', ''):6s} {r.get('isl', '') + '/' + r.get('osl', ''):>11s} {case.concurrency:7d}  {_layout(r):52s}"
        if why:
            print(f"{head} not simulated: {why}")
            continue
        m_ttft, m_tpot = float(r["silicon_ttft_ms"]), float(r["silicon_tpot_ms"])
        print(f"{head} {m_ttft:8.1f}/{ttft * 1e3:8.1f} {ttft * 1e3 / m_ttft - 1:+6.0%} "
              f"{m_tpot:7.2f}/{tpot * 1e3:7.2f} {tpot * 1e3 / m_tpot - 1:+6.0%}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="the rows' backend column (vllm, sglang, trtllm)")
    parser.add_argument("--model", default="", help="substring of model_path (default: every model)")
    parser.add_argument("--mode", choices=("agg", "disagg"), default=None, help="only rows of this mode")
    parser.add_argument("--split", choices=("fit", "test"), default="fit")
    parser.add_argument("--rows", action="store_true", help="also print each row of the shipped group")
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--jobs", type=count, default=2, help="processes (>= 1)")
    parser.add_argument("--out", type=Path, default=Path("outputs/score_serving"),
                        help="where each group's journal is kept (module doc)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]")
    args = parser.parse_args(argv)
    groups = [{}] + [parse_set(text) for text in args.sets]
    if args.sets and args.split == "test":
        _fail("--set with --split test: candidate values are tried on fit rows only; the test split is a report, "
              "never a target (score the shipped values on it without --set)")
    if not args.data.is_file():
        _fail(f"--data {args.data}: no such file")
    try:  # the journal's folder: bad input is named here, before any simulation
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"--out {args.out}: cannot hold the journal ({exc.strerror or exc})")
    cases = load_cases(args.data)
    dup = duplicates(cases)
    chosen = [c for c, d in zip(cases, dup, strict=True) if not c.skip and not d and split_of(c.row) == args.split
              and c.row.get("backend", "").strip() == args.backend and args.model in c.row.get("model_path", "")
              and (args.mode is None or c.row.get("mode", "").strip() == args.mode)]
    if not chosen:
        _fail(f"--backend/--model/--mode: no simulated {args.split} row with backend {args.backend!r}, a "
              f"model_path containing {args.model!r} and mode {args.mode or 'any'} in {args.data}")
    for overrides in groups[1:]:  # a value a profile refuses is named here, not in a worker
        for runtime in sorted({c.runtime for c in chosen}):
            try:
                get_runtime(runtime).with_overrides(**overrides)
            except ValueError as exc:
                _fail(f"--set: {str(exc).splitlines()[0]}")
    print(f"{args.backend} {args.model or '(every model)'} {args.mode or ''}: {split_label(args.split, len(chosen))}")
    result = {"backend": args.backend, "model": args.model, "mode": args.mode, "split": args.split,
              "rows": len(chosen), "groups": []}
    stamp = fingerprint(args.data)
    for overrides in groups:
        results = _score_group(chosen, overrides, args, stamp)
        if args.rows and not overrides:
            _print_rows(chosen, results)
        summary = _summary(chosen, results)
        result["groups"].append({"set": overrides, **summary})
        print(f"  {json.dumps(overrides) if overrides else 'shipped':60s} TTFT {summary['median_abs_ttft_error']:6.1%} "
              f"({summary['median_signed_ttft_error']:+.1%})  TPOT {summary['median_abs_tpot_error']:6.1%} "
              f"({summary['median_signed_tpot_error']:+.1%}; <= {LOW_LOAD_CLIENTS} clients "
              f"{_signed(summary['median_signed_tpot_error_low_load'])}, more "
              f"{_signed(summary['median_signed_tpot_error_high_load'])})  [{summary['simulated']} simulated]")
    print(dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
