"""``shard-validate study=serving data=CSV``: measured serving runs against the serving simulator.

Takes any CSV in the schema of aiconfigurator's ``silicon_sample.csv`` (the shipped
``validation/data/serving_h200_measured.csv`` is its H200 rows). Each row becomes a closed-loop run
of ``silicon_concurrency`` clients against the row's layout (:mod:`.mapping`), simulated with the
row's runtime profile; the simulated mean TTFT and TPOT over every request are compared with the
measured ones.

The client is simulated as the one that measured the rows: the sample's rows come from SemiAnalysis
InferenceX's nightly runs (its ``silicon_data_source`` names their database dump, config and workflow
ids), whose ``utils/bench_serving/benchmark_serving.py`` runs ``--max-concurrency C --request-rate inf
--ignore-eos --random-range-ratio 0.8`` (``.github/workflows/benchmark-tmpl.yml``): every request's
input and output lengths drawn uniformly from the integers ``[floor(0.8 L), L]``, the first ``C``
requests sent together and each finished one replaced at once, warm-up requests left out, TTFT the
mean over requests and TPOT the mean of ``(latency - TTFT) / (output tokens - 1)``. It sends
``10 C`` requests (``5 C`` for GLM-5: :func:`.launch.requests_per_client`), and so does the study
(:data:`REQUESTS_PER_CLIENT`): its opening wave, when all
clients' prompts arrive at once, weighs a tenth of the mean TTFT as in the measurement (at 4 per
client, as before, it weighed a quarter and inflated TTFT at high concurrency).

The sample's other rows (aiconfigurator's own sweeps: ISL 1000-8000, OSL 100-2000) are simulated with the
same client. aiconfigurator's eval runner (``src/aiconfigurator/eval/benchmarks/genai_perf_runner.py``)
measures through Dynamo with genai-perf: chat endpoint, streaming, fixed lengths (standard deviation 0,
``ignore_eos``), ``--concurrency C``, ``--request-count 10 C``, ``--warmup-request-count 2 C``; whether
the sample's sweep rows came from that runner is not recorded. Simulated with its fixed lengths, the
closed loop runs in lock step (every client's next prompt arrives in the same step) and the 51
Qwen3-235B vLLM sweep rows' median TTFT error goes from 12% to 126% (TPOT 11% to 24%): the measured runs
did not stay in lock step, so the drawn lengths stay.

Fit and test: the runtime profiles' host cost per step is fitted (``python -m validation.studies.serving.fit``)
on the rows of the models in :data:`FIT_MODELS` only; every other model's rows are the test set. The
study labels each row and reports both sets, test first.

One measurement, one row: the sample lists some InferenceX runs more than once, some copies rounded to
0.01 ms (:mod:`.measurement`). Of the rows that are one measurement, the first that maps to a simulation
is simulated and scored, the others are written with ``duplicate_of`` its id and left out of every count.

Writes ``rows.csv`` (the input columns plus ``set``, ``sim_ttft_ms``, ``sim_tpot_ms``,
``ttft_rel_error``, ``tpot_rel_error``, ``skipped_reason``, and ``command``: the ``shard-sim
workload=serving`` command line that reruns the row's simulation, :mod:`.command`) and ``summary.json``; prints per-backend
and per-mode tables and ends with one JSON line (printed by the app). A ``notes`` column says what the
mapping read that the row did not state (``concurrency_from_batch``: no ``silicon_concurrency=N``, the
clients read from ``batch_size``; counted in the summary).

``study.cross_validate=true`` runs, instead, leave-one-group-out over the fit rows (:mod:`.cross_validate`):
each (model, runtime) group predicted by the runtime's host constants refitted without it. Its medians
over groups are the figures to steer by; the test set stays a report.

Scripts beside the study (``python -m validation.studies.serving.<name>``): :mod:`.fit` (each runtime's
host time per step, request path and MoE constants on the fit rows), :mod:`.score` (candidate runtime values
scored on measured rows), :mod:`.explain` (a row's simulated decode step part by part), :mod:`.kv_capacity`
(the KV-cache size against the runtimes' start-up logs), :mod:`.speculative` (DeepSeek-R1 with and without
MTP), :mod:`.disagg` (the best disaggregated against the best aggregated plan) and :mod:`.measure_launch`
(kernel launch costs timed on a local GPU and its host).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from planner.apps.common import atomic_write_text
from simcore.files import dumps
from simcore.serving import LengthDist, ServingConfig, get_runtime, simulate_serving
from validation.studies.common import read_csv
from validation.studies.serving.command import shard_sim_command
from validation.studies.serving.journal import fingerprint, simulate_rows
from validation.studies.serving.launch import REQUESTS_PER_CLIENT
from validation.studies.serving.mapping import RowCase, map_row
from validation.studies.serving.measurement import duplicates, measurement_key

__all__ = ["run", "simulate_case", "case_runtime", "serving_config", "harness_lengths", "FIT_MODELS", "load_cases", "split_of",
           "summarize_rows", "RANGE_RATIO", "REQUESTS_PER_CLIENT", "measurement_key", "duplicates"]

#: Models whose rows the runtime fit may use; every other model's rows are the test set. Every backend
#: is covered, and so are host-bound rows (a small model at hundreds of sequences), without which the
#: host cost per sequence cannot be told from zero.
#: ``deepseek-ai/DeepSeek-V3`` is fit with DeepSeek-R1: its rows are InferenceX's DeepSeek-R1 runs (ids
#: ``dsr1_*``), most of them the very measurements of DeepSeek-R1 rows, of the same architecture.
FIT_MODELS = ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-8B-Instruct", "nvidia/Llama-3.1-8B-Instruct-FP8",
              "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-235B-A22B-FP8")

_OUT_COLUMNS = ("set", "clients", "sim_ttft_ms", "sim_tpot_ms", "ttft_rel_error", "tpot_rel_error", "skipped_reason",
                "duplicate_of", "command", "notes")


def split_of(row: dict) -> str:
    return "fit" if row.get("model_path", "").strip() in FIT_MODELS else "test"


def load_cases(path: Path) -> list[RowCase]:
    _, rows = read_csv(path, ("model_path", "backend", "system", "mode", "isl", "osl", "silicon_data_source",
                              "silicon_ttft_ms", "silicon_tpot_ms"))
    if not rows:
        raise ValueError(f"data: {path} holds no rows")
    return [map_row(r) for r in rows]


#: InferenceX's ``--random-range-ratio``: lengths uniform in ``[floor(RANGE_RATIO * L), L]`` (module doc)
RANGE_RATIO = 0.8


def harness_lengths(length: int, name: str) -> LengthDist:
    """The measuring client's length draw for a nominal ``length`` (``isl`` or ``osl``)."""
    low = max(int(RANGE_RATIO * length), 1)
    return LengthDist(kind="uniform", mean=(low + length) / 2, low=low, high=length, name=name)


def serving_config(case: RowCase) -> ServingConfig:
    """The row's closed-loop run as the measuring client made it (module doc)."""
    return ServingConfig(concurrency=case.concurrency, num_requests=case.requests_per_client * case.concurrency,
                         input_len=harness_lengths(case.isl, "isl"), output_len=harness_lengths(case.osl, "osl"),
                         runtime=case.runtime)


def case_runtime(case: RowCase, runtime=None):
    """The row's runtime profile (``runtime``, or the row's backend's) with the harness's launch flags."""
    return (runtime or get_runtime(case.runtime)).with_overrides(**case.launch)


def simulate_case(case: RowCase, runtime=None) -> tuple[float, float, str]:
    """Simulated mean (TTFT, TPOT) in seconds, or nan and why not."""
    result = simulate_serving(case.ctx, case.plan, serving_config(case), runtime=case_runtime(case, runtime))
    if not result.feasible:
        return math.nan, math.nan, result.reason
    return result.metrics.ttft_s["mean"], result.metrics.tpot_s["mean"], ""


def _measured(row: dict, key: str) -> float:
    """A measured value, nan where the row has none (such a row is skipped by :func:`map_row`)."""
    try:
        return float(row.get(key) or "nan")
    except ValueError:
        return math.nan


def _rel(sim: float, measured: float) -> float:
    return (sim - measured) / measured if measured > 0 and sim == sim else math.nan


def summarize_rows(rows: list[dict]) -> dict:
    """Median |error| of TTFT and TPOT and row counts, for the rows given, each measurement once (rows
    with a ``duplicate_of`` are left out)."""
    rows = [r for r in rows if not r.get("duplicate_of")]
    done = [r for r in rows if not r["skipped_reason"]]
    tt = [abs(float(r["ttft_rel_error"])) for r in done]
    signed = [float(r["tpot_rel_error"]) for r in done]
    return {"rows": len(rows), "simulated": len(done),
            "median_abs_ttft_error": float(np.median(tt)) if tt else math.nan,
            "median_abs_tpot_error": float(np.median(np.abs(signed))) if signed else math.nan,
            "median_signed_tpot_error": float(np.median(signed)) if signed else math.nan}


def _table(title: str, groups: dict[str, list[dict]], order=None) -> None:
    """One printed table, a line per group in ``order`` (a sort key over the group names; by name)."""
    print(f"\n{title}")
    print(f"{'':44s} {'rows':>5s} {'sim':>5s} {'|TTFT err|':>11s} {'|TPOT err|':>11s} {'TPOT err':>9s}")
    for key, rows in sorted(groups.items(), key=lambda item: order(item[0]) if order else item[0]):
        s = summarize_rows(rows)
        print(f"{key:44s} {s['rows']:5d} {s['simulated']:5d} {s['median_abs_ttft_error']:11.1%} "
              f"{s['median_abs_tpot_error']:11.1%} {s['median_signed_tpot_error']:+9.1%}")


def _simulate_row(row: dict) -> tuple[float, float, str]:
    """:func:`simulate_case` of a CSV row (what a worker process is handed: rows pickle, cases need not)."""
    case = map_row(row)
    if case.skip:
        return math.nan, math.nan, case.skip
    try:
        return simulate_case(case)
    except ValueError as exc:  # input the simulator refuses (ServingInputError and kin): one line, named
        return math.nan, math.nan, str(exc).splitlines()[0]


def run(data: Path, out: Path, study=None) -> dict:
    """The study on ``data`` (``study.cross_validate`` runs :mod:`.cross_validate` instead: the app
    dispatches it, since that module builds on this one)."""
    cases = load_cases(data)
    dup = duplicates(cases)
    unique = [c for c, d in zip(cases, dup, strict=True) if not d]
    keys = [repr(measurement_key(c.row)) for c in unique]
    simulated = iter(simulate_rows([c.row for c in unique], keys, _simulate_row, getattr(study, "jobs", None),
                                   out, fingerprint(data)))
    rows = []
    for case, duplicate_of in zip(cases, dup, strict=True):
        ttft, tpot, reason = (math.nan, math.nan, "duplicate measurement") if duplicate_of else next(simulated)
        row = dict(case.row)
        row["set"] = split_of(row)
        m_ttft, m_tpot = _measured(row, "silicon_ttft_ms"), _measured(row, "silicon_tpot_ms")
        row.update(sim_ttft_ms=ttft * 1e3, sim_tpot_ms=tpot * 1e3, ttft_rel_error=_rel(ttft * 1e3, m_ttft),
                   tpot_rel_error=_rel(tpot * 1e3, m_tpot), skipped_reason=reason, duplicate_of=duplicate_of)
        row["clients"] = case.concurrency or ""
        row["notes"] = "; ".join(case.notes)  # concurrency_from_batch: clients read from batch_size (.mapping)
        # the shard-sim command line that reruns this row's simulation (.command)
        row["command"] = shard_sim_command(case, serving_config(case).num_requests, RANGE_RATIO) if not reason else ""
        rows.append(row)
        if not reason:
            print(f"{row['set']:4s} {row['backend']:6s} {row['mode']:6s} {case.model:16s} "
                  f"c={case.concurrency:<5d} {case.plan.describe():48s} TTFT {m_ttft:8.1f} -> {ttft * 1e3:8.1f} ms  "
                  f"TPOT {m_tpot:6.2f} -> {tpot * 1e3:6.2f} ms")
    out.mkdir(parents=True, exist_ok=True)
    columns = list(cases[0].row.keys()) + list(_OUT_COLUMNS) if cases else list(_OUT_COLUMNS)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "rows.csv", text.getvalue())
    summary = {"study": "serving", "data": str(data)}
    for name in ("test", "fit"):
        part = [r for r in rows if r["set"] == name]
        summary[name] = summarize_rows(part)
        _table(f"{name} set, by backend", _group(part, lambda r: r["backend"]))
        _table(f"{name} set, by mode", _group(part, lambda r: r["mode"]))
        _table(f"{name} set, by model and backend", _group(part, _model_backend))
        _table(f"{name} set, by load", _group(part, _load), order=_load_order)
        summary[f"{name}_by_load"] = {k: summarize_rows(v) for k, v in _group(part, _load).items()}
        by_both = _group(part, lambda r: f"{_model_backend(r)}, {_load(r)}")
        _table(f"{name} set, by model, backend and load", by_both,
               order=lambda k: (k.rsplit(", ", 1)[0], _load_order(k.rsplit(", ", 1)[1])))
        summary[f"{name}_by_model_and_load"] = {k: summarize_rows(v) for k, v in by_both.items()}
    summary["all"] = summarize_rows(rows)
    summary["simulated_share"] = summary["all"]["simulated"] / max(summary["all"]["rows"], 1)
    summary["duplicates"] = sum(bool(d) for d in dup)
    summary["concurrency_from_batch"] = sum("concurrency_from_batch" in c.notes for c, d in zip(cases, dup, strict=True)
                                            if not d and not c.skip)
    summary["by_backend"] = {k: summarize_rows(v) for k, v in _group(rows, lambda r: r["backend"]).items()}
    summary["by_mode"] = {k: summarize_rows(v) for k, v in _group(rows, lambda r: r["mode"]).items()}
    summary["by_model"] = {k: summarize_rows(v) for k, v in _group(rows, _model_backend).items()}
    skipped: dict[str, int] = {}
    for r in rows:
        if r["skipped_reason"] and not r["duplicate_of"]:
            skipped[r["skipped_reason"]] = skipped.get(r["skipped_reason"], 0) + 1
    summary["skipped"] = skipped
    atomic_write_text(out / "summary.json", dumps(summary, indent=2, default=str) + "\n")
    print(f"\nskipped: {sum(skipped.values())} rows; " + "; ".join(f"{v} x {k}" for k, v in skipped.items()))
    print(f"duplicates: {summary['duplicates']} rows repeat another row's measurement, scored once")
    return summary


def _model_backend(row: dict) -> str:
    """``Kimi-K2.5 vllm``: the model's name (after its organisation) and the backend."""
    return f"{(row.get('model_path') or '').strip().split('/')[-1]} {row.get('backend', '')}"


#: Client-count bands of the per-load tables: where a step's fixed costs (host, per-layer kernels) dominate,
#: the middle, and where what grows with the batch (expert weights touched, KV reads) does.
LOAD_BANDS = ((8, "1-8 clients"), (32, "9-32 clients"), (math.inf, "33+ clients"))


def _load(row: dict) -> str:
    """The row's client-count band (:data:`LOAD_BANDS`); rows whose mapping found no count: ``unknown``."""
    clients = row.get("clients")
    if not clients:
        return "unknown clients"
    return next(label for top, label in LOAD_BANDS if int(clients) <= top)


def _load_order(label: str) -> int:
    """Where a band's line goes in the per-load tables: lightest first, ``unknown`` last."""
    labels = [band for _, band in LOAD_BANDS]
    return labels.index(label) if label in labels else len(labels)


def _group(rows: list[dict], key) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out
