"""Leave-one-group-out cross-validation of the serving runtimes' fitted constants: the figure to steer by.

``shard-validate study=serving study.cross_validate=true [data=CSV]``: the fit rows of the data (the models of
:data:`validation.studies.serving.FIT_MODELS`, each measurement once, the rows :mod:`.fit` fits on: aggregated,
up to 512 clients) fall into groups, one per (model, runtime profile); DeepSeek-V3's rows join DeepSeek-R1's
(they are InferenceX's DeepSeek-R1 runs, many the very same measurements). For each group, what
``python -m validation.studies.serving.fit`` fits for that runtime (:func:`.fit.fit_host`: ``step_host_s`` and
``step_host_per_seq_s`` on TPOT, then the request path, ``request_s`` and ``tokenize_s_per_token``, on
TTFT) is fitted again on the runtime's other groups
only, and the group's rows are predicted with it: simulated as the study simulates them, under the
runtime's profile with those values. Per group: the median ``|relative error|`` of TPOT and of TTFT over
its rows so predicted (``tpot``, ``ttft``); the same read as the fit reads a row (``retimed_tpot``,
``retimed_ttft``: below), which shows what the fit's reading of the request path leaves out; in sample
(``fit_tpot``, ``fit_ttft``: fitted on every group, as :mod:`.fit` does, read as the fit reads) and at
the shipped profiles' values (``shipped_*``, read so too). The summary's
``logo_tpot_median`` and ``logo_ttft_median`` are the medians over groups of the left-out figures;
``logo_worst_group`` the group whose larger left-out error (TPOT or TTFT) is the largest. A group whose
runtime has no other group is not predicted (``null``) and left out of the medians.

Cost: every row is simulated twice. Once with no host time and no request path, then re-timed under every
candidate of every fold (:mod:`.host_replay`): a TPOT so re-timed is exactly what a simulation with those
host constants and no request path gives; a TTFT is that plus ``request_s``, which is how :mod:`.fit`
reads the request path (a request that reaches the scheduler mid-step waits for the step's end, which this
reading leaves out: short requests at few clients read shorter than they simulate). And once under its
group's refitted values, the prediction. Both are journaled in the run dir (the recordings in
``recordings/``; the predictions in ``rows.jsonl``, the study's own journal, a row whose refitted values
are the shipped ones under the study's key: a plain study run in the same dir shares them), so the same
command in the same ``hydra.run.dir`` reads them back; a changed data file or pricing code simulates again.
About 17 minutes on 2 shared cores for the shipped sample's 342 fit rows (9 recording, 8 predicting).

Held, not refitted (their fits saw every group, so they leak into every fold): TensorRT-LLM's all-reduce
latency ``custom_ar_s`` (GPU time: a simulation of every row per grid value; :mod:`.fit` fits it so), and
the MoE block's constants (``fit --moe``, ``--moe-prefill``). Test rows never enter: the test set stays
the study's report, never a target.

Writes ``cross_validation.json``; prints a line per group and ends with one JSON line (printed by the app).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from planner.apps.common import atomic_write_text
from simcore.files import dumps
from simcore.serving import get_runtime
from validation.studies.serving import duplicates, load_cases, measurement_key, simulate_case, split_of
from validation.studies.serving.fit import fit_host, host_rows
from validation.studies.serving.host_replay import HOST_FIELDS, Recording, record_rows, request_path_s, retime
from validation.studies.serving.journal import fingerprint, simulate_rows

__all__ = ["cross_validate", "group_of", "predict", "SAME_MODEL"]

#: presets whose rows are one model's measurements (module doc)
SAME_MODEL = {"deepseek-v3": "deepseek-r1"}


def group_of(case) -> str:
    """A fit row's group: ``deepseek-r1 sglang`` (its model preset, :data:`SAME_MODEL` joined, and runtime)."""
    return f"{SAME_MODEL.get(case.model, case.model)} {case.runtime}"


def predict(rows: list, constants: dict) -> dict:
    """Median ``|relative error|`` of TPOT and TTFT over ``rows`` (``(case, Recording)`` pairs) re-timed under
    ``constants`` (``step_host_s``, ``step_host_per_seq_s``, ``request_s``, ``tokenize_s_per_token``; module doc)."""
    errs = {"tpot": [], "ttft": []}
    for case, rec in rows:
        ttft, tpot = retime(rec, constants["step_host_s"], constants["step_host_per_seq_s"])
        errs["tpot"].append(abs(tpot * 1e3 / float(case.row["silicon_tpot_ms"]) - 1))
        path = request_path_s(rec, constants["request_s"], constants["tokenize_s_per_token"])
        errs["ttft"].append(abs((ttft + path) * 1e3 / float(case.row["silicon_ttft_ms"]) - 1))
    return {k: float(np.nanmedian(v)) if v else math.nan for k, v in errs.items()}


def _errors(rows: list, results: list) -> dict:
    """Median ``|relative error|`` of TPOT and TTFT of simulated ``results`` (``(ttft_s, tpot_s, why)``)."""
    errs = {"tpot": [], "ttft": []}
    for (case, _), (ttft, tpot, why) in zip(rows, results, strict=True):
        if not why:
            errs["tpot"].append(abs(tpot * 1e3 / float(case.row["silicon_tpot_ms"]) - 1))
            errs["ttft"].append(abs(ttft * 1e3 / float(case.row["silicon_ttft_ms"]) - 1))
    return {k: float(np.median(v)) if v else math.nan for k, v in errs.items()}


def _simulate_with(args) -> tuple[float, float, str]:
    """A worker's simulation of one CSV row under its runtime's profile with ``overrides`` (the study's
    simulation of it: :func:`validation.studies.serving.simulate_case`)."""
    from validation.studies.serving.mapping import map_row

    row, overrides = args
    case = map_row(row)
    if case.skip:
        return math.nan, math.nan, case.skip
    try:
        return simulate_case(case, get_runtime(case.runtime).with_overrides(**overrides))
    except ValueError as exc:  # input the simulator refuses, named (as the study does)
        return math.nan, math.nan, str(exc).splitlines()[0]


def _predictions(folds: dict, groups: dict, data: Path, out: Path, jobs: int | None) -> dict[str, list]:
    """Each predicted group's rows simulated under its fold's values, journaled in ``out`` (module doc)."""
    todo, keys = [], []
    for name, fold in folds.items():
        shipped = get_runtime(_runtime(name))
        overrides = {f: fold[f] for f in HOST_FIELDS}
        same = all(getattr(shipped, f) == v for f, v in overrides.items())  # the study's own simulation
        for case, _ in groups[name]:
            todo.append((case.row, overrides))
            keys.append(repr(measurement_key(case.row)) + ("" if same else " " + json.dumps(overrides, sort_keys=True)))
    print(f"cross-validation: {len(todo)} rows simulated under their group's refitted values", flush=True)
    results = iter(simulate_rows(todo, keys, _simulate_with, jobs, out, fingerprint(data)))
    return {name: [next(results) for _ in groups[name]] for name in folds}


def _constants(fit: dict) -> dict:
    return {k: fit[k] for k in HOST_FIELDS} | {"ttft_client": fit["ttft_client"]}


def _recorded(data: Path, out: Path, jobs: int | None) -> tuple[dict[str, list], int]:
    """The fit rows' recordings by group, and how many fit rows could not be re-timed."""
    every = [c for c in load_cases(data) if split_of(c.row) == "fit"]
    cases = [c for c, d in zip(every, duplicates(every), strict=True) if not c.skip and not d]
    cases = [c for rt in sorted({c.runtime for c in cases}) for c in host_rows(cases, rt)]
    print(f"cross-validation: {len(cases)} fit rows of {data}, each simulated once (journal: {out / 'recordings'})",
          flush=True)
    groups: dict[str, list] = {}
    missed = 0
    for case, rec in zip(cases, record_rows(cases, jobs, out / "recordings", fingerprint(data)), strict=True):
        if isinstance(rec, Recording):
            groups.setdefault(group_of(case), []).append((case, rec))
        else:
            missed += 1
            print(f"  not re-timed: {case.row.get('id', '')}: {rec}")
    return groups, missed


def _runtime(name: str) -> str:
    return name.rsplit(" ", 1)[1]


def cross_validate(data: Path, out: Path, jobs: int | None = None) -> dict:
    """Leave-one-group-out over the fit rows of ``data`` (module doc); writes ``cross_validation.json`` in
    ``out`` and returns the summary."""
    start = time.perf_counter()
    groups, missed = _recorded(data, out, jobs)
    full = {rt: fit_host([r for g, rows in groups.items() if _runtime(g) == rt for r in rows])
            for rt in sorted({_runtime(g) for g in groups})}
    folds = {}
    for name in sorted(groups):
        others = [r for g, rs in groups.items() if g != name and _runtime(g) == _runtime(name) for r in rs]
        if others:
            folds[name] = fit_host(others)
    simulated = _predictions(folds, groups, data, out, jobs)
    report = {}
    for name, rows in sorted(groups.items()):
        shipped, fold = get_runtime(_runtime(name)), folds.get(name)
        left_out = _errors(rows, simulated[name]) if fold else {"tpot": None, "ttft": None}
        retimed = predict(rows, fold) if fold else {"tpot": None, "ttft": None}
        in_sample = predict(rows, full[_runtime(name)])
        at_shipped = predict(rows, {f: getattr(shipped, f) for f in HOST_FIELDS})
        report[name] = {"rows": len(rows), **left_out, "retimed_tpot": retimed["tpot"], "retimed_ttft": retimed["ttft"],
                        "fit_tpot": in_sample["tpot"], "fit_ttft": in_sample["ttft"],
                        "shipped_tpot": at_shipped["tpot"], "shipped_ttft": at_shipped["ttft"],
                        "refit": _constants(fold) if fold else None}
        print(f"{name:28s} {len(rows):4d} rows  left out: TPOT {_pct(left_out['tpot'])} TTFT {_pct(left_out['ttft'])}"
              f" (re-timed {_pct(retimed['tpot'])} {_pct(retimed['ttft'])})   in sample: TPOT "
              f"{_pct(in_sample['tpot'])} TTFT {_pct(in_sample['ttft'])}   refit: "
              + (_describe(fold) if fold else "none (no other group of its runtime)"), flush=True)
    predicted = {k: v for k, v in report.items() if v["tpot"] is not None}
    worst = max(predicted, key=lambda k: max(predicted[k]["tpot"], predicted[k]["ttft"]), default=None)
    summary = {"study": "serving", "cross_validation": "leave one (model, runtime) group out", "data": str(data),
               "rows": sum(len(v) for v in groups.values()), "not_retimed": missed, "groups_predicted": len(predicted),
               "logo_tpot_median": _median([v["tpot"] for v in predicted.values()]),
               "logo_ttft_median": _median([v["ttft"] for v in predicted.values()]),
               "logo_worst_group": {"name": worst, "tpot": predicted[worst]["tpot"], "ttft": predicted[worst]["ttft"]}
               if worst else None,
               "fit_tpot_median": _median([v["fit_tpot"] for v in predicted.values()]),
               "fit_ttft_median": _median([v["fit_ttft"] for v in predicted.values()]),
               "groups": report, "fitted_on_every_group": {rt: _constants(f) for rt, f in full.items()},
               "held": "custom_ar_s (TensorRT-LLM), the MoE block's constants", "wall_s": time.perf_counter() - start}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "cross_validation.json", dumps(summary, indent=2) + "\n")
    print(f"\nleft-out medians over {len(predicted)} groups: TPOT {_pct(summary['logo_tpot_median'])}, TTFT "
          f"{_pct(summary['logo_ttft_median'])}; in sample {_pct(summary['fit_tpot_median'])}, "
          f"{_pct(summary['fit_ttft_median'])}; worst: {worst}")
    return summary


def _median(values: list) -> float:
    return float(np.median(values)) if values else math.nan


def _pct(x) -> str:
    return "  n/a " if x is None or x != x else f"{x:6.1%}"


def _describe(fit: dict) -> str:
    return (f"{fit['step_host_s'] * 1e3:g} ms + {fit['step_host_per_seq_s'] * 1e6:g} us/seq, request "
            f"{fit['request_s'] * 1e3:g} ms + {fit['tokenize_s_per_token'] * 1e6:g} us/prompt token ({fit['ttft_client']} rows)")
