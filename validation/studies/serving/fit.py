"""Fit each serving runtime's host time per step and request path on the fit set of the measured serving runs.

``python -m validation.studies.serving.fit [--data CSV] [--rows N] [--jobs 2] [--out DIR]``: for each runtime
profile (vLLM sync and overlapped, SGLang, TensorRT-LLM; a profile with no fit rows is left as it is), on its
aggregated fit rows at up to 512 clients (the models of :data:`validation.studies.serving.FIT_MODELS`; at
most ``--rows`` of them, spread evenly; every one by default), each simulated once as the study simulates it
but with no host time and no request path, and re-timed from there (:mod:`.host_replay`: exactly what a
simulation with the candidate constants and no request path gives; :func:`fit_host`):

1. its host time per step, ``RuntimeProfile.step_host_s`` (fixed: scheduling and launch bookkeeping) and
   ``step_host_per_seq_s`` (per running sequence: its inputs, sampling bookkeeping, detokenizing and
   streaming), jointly on the grids :data:`GRID_S` x :data:`GRID_PER_SEQ_S`, to minimise the median of
   ``|log(simulated / measured)|`` of the rows' mean TPOT (the host time per step sets TPOT; TTFT is mostly
   queueing); ties go to the smaller value;
2. then its request path (:meth:`simcore.serving.runtime.RuntimeProfile.request_path_s`): the fixed latency
   ``request_s`` (HTTP, hand-off to the scheduler, the first token's way back) and the prompt's
   tokenization per token ``tokenize_s_per_token``, jointly on :data:`GRID_REQUEST_S` x
   :data:`GRID_TOKENIZE_S_PER_TOKEN`, each bounded by what that mechanism can take (50 ms, 4 us a token:
   TTFT beyond stays the simulation's error, shown as such, never absorbed by a longer path), on the
   median ``|log|`` error of the mean TTFT of the rows measured by the client the study simulates:
   InferenceX's (rows at its lengths, :data:`validation.studies.serving.launch.HARNESS_LENGTHS`; every row
   where the runtime has none of them). The other fit rows (aiconfigurator's own sweeps, ISL 1000-8000)
   come from a client whose warm-up, ramp and TTFT definition are not documented, so their TTFT cannot
   tell the request path from the client's. It adds to every TTFT, so the grid is scored on ``simulated
   without it + request_s + tokenize_s_per_token x mean prompt``: a reading, not the simulation (the
   study's full runs simulate the delay; a request that reaches the scheduler mid-step waits for the
   step's end, which weighs on short requests at few clients: 2 vLLM clients of 16-token requests, 30 ms,
   read 23% short).

TensorRT-LLM's small all-reduce kernel's fixed latency (``custom_ar_s``, which it takes for one-shot and
two-shot alike: no published timing of its fused kernel; vLLM's and SGLang's two latencies are fitted on
their kernels' published timings by ``python -m validation.studies.collectives.fit_custom_allreduce``) is GPU
time, not host time: each value of :data:`GRID_CUSTOM_AR_S` is recorded on its own and fitted as above,
and the value whose host fit scores best is kept. ``--only-request`` keeps the host constants as they are
and fits the request path alone. Each row's recording is journaled under ``--out`` (a rerun reads it back;
a changed data file or pricing code records again). The same fit, without one (model, runtime) group at a
time, is the study's cross-validation (:mod:`.cross_validate`).

The data are fit rows: with ``--data``, a file holding a test row (a model outside ``FIT_MODELS``) is refused
(one line, exit 2); without it, the shipped sample's fit rows (the sample's split is by model: its test
models' rows are never loaded). Prints the chosen values (copy them into ``simcore/serving/runtime.py``)
and ends with one JSON line.

``--moe`` fits, instead of the host constants, the runtime's MoE block on the TPOT of its MoE fit rows
(``--rows`` of them): ``moe_memory_efficiency`` (its grouped expert kernels' HBM bandwidth on the
experts' weights, a share of a dense GEMM's) and ``moe_layer_s`` (its fixed GPU time per MoE layer and
step beyond the GEMMs: routing, token alignment, the grouped kernels' grids over all experts), jointly on
the grids :data:`GRID_MOE_EFFICIENCY` x :data:`GRID_MOE_LAYER_S`; then ``request_s`` again on TTFT.

``--moe-prefill`` fits the runtime's grouped expert kernels' tensor-core rate at prefill sizes
(``moe_gemm_efficiency``) on the TTFT of its MoE fit rows (``--ttft-rows`` of them, any client): each
value of :data:`GRID_MOE_GEMM_EFFICIENCY` is scored with its own best request delay from
:data:`GRID_REQUEST_S` (a nuisance intercept: the sweep rows' client is not documented, module doc
above), so the fit reads how TTFT grows with the prompt's expert work, not its offset. ``request_s`` is
then fitted again, as above, on the harness rows of every fit model.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from planner.apps.common import atomic_write_text
from simcore.files import dumps
from simcore.serving import get_runtime
from validation.studies.common.cli import BadInput, count, run_script
from validation.studies.serving import FIT_MODELS, duplicates, load_cases, simulate_case, split_of
from validation.studies.serving.host_replay import Recording, record_rows, request_path_s, retime
from validation.studies.serving.journal import fingerprint
from validation.studies.serving.launch import HARNESS_LENGTHS

__all__ = ["main", "fit_host", "fit_request", "host_rows", "GRID_S", "GRID_PER_SEQ_S", "GRID_REQUEST_S",
           "GRID_TOKENIZE_S_PER_TOKEN"]

GRID_S = (0.0, 1e-3, 2e-3, 3e-3, 4e-3, 6e-3, 9e-3, 12e-3)
GRID_PER_SEQ_S = (0.0, 10e-6, 20e-6, 40e-6, 60e-6, 90e-6, 120e-6)
GRID_CUSTOM_AR_S = (3e-6, 6e-6, 9e-6, 14e-6, 20e-6)
#: the request path's fixed latency (HTTP, hand-off to the scheduler, the first chunk's way back): up to
#: 50 ms, what an HTTP server and an inter-process hand-off take; TTFT beyond it stays the simulation's error
GRID_REQUEST_S = (0.0, 5e-3, 10e-3, 15e-3, 20e-3, 30e-3, 40e-3, 50e-3)
#: the prompt's tokenization per token: up to 4 us, a slow tokenizer path (a fast one takes ~0.2-2 us)
GRID_TOKENIZE_S_PER_TOKEN = (0.0, 0.5e-6, 1e-6, 2e-6, 4e-6)
GRID_MOE_EFFICIENCY = (1.0, 0.85, 0.7, 0.5, 0.35)
GRID_MOE_LAYER_S = (0.0, 25e-6, 50e-6, 75e-6, 100e-6, 125e-6, 150e-6)
GRID_MOE_GEMM_EFFICIENCY = (0.7, 0.5, 0.35, 0.25, 0.18, 0.12)
_DATA = Path(__file__).resolve().parents[2] / "data" / "serving_h200_measured.csv"
_RUNTIMES = ("vllm-sync", "vllm", "sglang", "trtllm")


def _median_abs_log(sim: np.ndarray, measured: np.ndarray) -> float:
    """Median ``|log(sim / measured)|`` over the rows whose simulation gave a number (inf: none did)."""
    ok = np.isfinite(sim) & (sim > 0)
    return float(np.median(np.abs(np.log(sim[ok] / measured[ok])))) if ok.any() else math.inf


def host_rows(cases: list, backend: str) -> list:
    """The rows a runtime's host constants are fitted on: its aggregated rows at up to 512 clients."""
    return [c for c in cases if c.runtime == backend and c.plan.mode == "agg" and c.concurrency <= 512]


def fit_request(rows: list, step_host_s: float, step_host_per_seq_s: float) -> dict:
    """The request path, ``request_s`` and ``tokenize_s_per_token`` jointly on :data:`GRID_REQUEST_S` x
    :data:`GRID_TOKENIZE_S_PER_TOKEN` (module doc, step 2), over ``rows`` (``(case, Recording)`` pairs) at
    the given host constants: the median ``|log|`` error of TTFT on the InferenceX rows among them, on
    every row where there is none (``ttft_client`` says which); ties go to the smaller values."""
    harness = [(c, r) for c, r in rows if c.isl in HARNESS_LENGTHS and c.osl in HARNESS_LENGTHS]
    client, use = ("harness", harness) if harness else ("any", rows)
    base = np.array([retime(r, step_host_s, step_host_per_seq_s)[0] for _, r in use])
    prompt = np.array([request_path_s(r, 0.0, 1.0) for _, r in use])  # mean prompt tokens of each row
    measured = np.array([float(c.row["silicon_ttft_ms"]) * 1e-3 for c, _ in use])
    scores = {(v, k): _median_abs_log(base + v + k * prompt, measured)
              for v in GRID_REQUEST_S for k in GRID_TOKENIZE_S_PER_TOKEN}
    (request_s, tokenize_s), score = min(scores.items(), key=lambda kv: kv[1])  # first of equals: the smaller
    return {"request_s": request_s, "tokenize_s_per_token": tokenize_s, "ttft_median_abs_log_error": score,
            "ttft_rows": len(use), "ttft_client": client, "ttft_scores": scores}


def fit_host(rows: list) -> dict:
    """A runtime's ``step_host_s`` and ``step_host_per_seq_s`` (joint grid, median ``|log|`` error of TPOT),
    then its ``request_s`` (:func:`fit_request`), on ``rows``: ``(case, Recording)`` pairs of its fit rows
    (module doc). The recordings are re-timed, never simulated again (:mod:`.host_replay`)."""
    measured = np.array([float(c.row["silicon_tpot_ms"]) * 1e-3 for c, _ in rows])
    scores = {(s, q): _median_abs_log(np.array([retime(r, s, q)[1] for _, r in rows]), measured)
              for s in GRID_S for q in GRID_PER_SEQ_S}
    (step_s, per_seq_s), score = min(scores.items(), key=lambda kv: kv[1])  # first of equals: the smaller
    return {"step_host_s": step_s, "step_host_per_seq_s": per_seq_s, "median_abs_log_error": score,
            "rows": len(rows), "scores": scores} | fit_request(rows, step_s, per_seq_s)


def _host_field(field: str, value: float) -> dict:
    """One grid value as profile fields: TensorRT-LLM's one all-reduce latency sets both of its kernels."""
    return {field: value} | ({"two_shot_ar_s": value} if field == "custom_ar_s" else {})


def _score(cases, runtime) -> float:
    errs = []
    for case in cases:
        ttft, tpot, why = simulate_case(case, runtime)
        if why:
            continue
        errs.append(abs(math.log(tpot * 1e3 / float(case.row["silicon_tpot_ms"]))))
    return float(np.median(errs)) if errs else math.inf


def _fit_request_s(cases, runtime) -> tuple[float, float, int]:
    """``(request_s, median |log error| of TTFT, rows)`` on :data:`GRID_REQUEST_S` (module doc)."""
    pairs = _ttft_pairs(cases, runtime)
    if not pairs:
        return runtime.request_s, math.inf, 0
    scores = {r: float(np.median([abs(math.log((t + r) / m)) for t, m in pairs])) for r in GRID_REQUEST_S}
    print(f"{runtime.name:7s} request_s            " + "  ".join(f"{v * 1e3:g}ms:{e:.3f}" for v, e in scores.items()),
          flush=True)
    best = min(scores, key=scores.get)
    return best, scores[best], len(pairs)


def _spread(cases: list, n: int) -> list:
    return cases[:: max(len(cases) // n, 1)][:n]


def _runtime_rows(fit: list, backend: str) -> list:
    """The runtime's aggregated fit rows at up to 512 clients."""
    return [c for c in fit if c.runtime == backend and c.plan.mode == "agg" and c.concurrency <= 512]


def _request_on_harness(rows: list, runtime, n: int) -> tuple[float, float, int]:
    """``request_s`` fitted on up to ``n`` of ``rows`` that InferenceX measured (module doc)."""
    harness = [c for c in rows if c.isl in HARNESS_LENGTHS and c.osl in HARNESS_LENGTHS]
    return _fit_request_s(_spread(harness, n), runtime)


def _moe_rows(fit: list, backend: str, n: int) -> tuple[list, list]:
    """The runtime's fit rows and up to ``n`` of its MoE ones, spread evenly (empty: it has none)."""
    rows = _runtime_rows(fit, backend)
    moe = _spread([c for c in rows if c.ctx.model.is_moe], n)
    if not moe:
        print(f"{backend}: no MoE fit rows")
    return rows, moe


def _ttft_pairs(cases, runtime) -> list[tuple[float, float]]:
    """(simulated TTFT without the request path, measured TTFT) in seconds, for the rows that simulate."""
    base = runtime.with_overrides(request_s=0.0)
    pairs = []
    for case in cases:
        ttft, _tpot, why = simulate_case(case, base)
        if not why:
            pairs.append((ttft, float(case.row["silicon_ttft_ms"]) * 1e-3))
    return pairs


def _intercept_score(pairs) -> float:
    """Median ``|log error|`` of TTFT at the best request delay of :data:`GRID_REQUEST_S`."""
    if not pairs:
        return math.inf
    return min(float(np.median([abs(math.log((t + r) / m)) for t, m in pairs])) for r in GRID_REQUEST_S)


def _fit_moe_prefill(fit: list, args) -> dict:
    """``moe_gemm_efficiency`` per runtime on its MoE rows' TTFT (own intercept), then ``request_s`` on
    its harness rows' TTFT (module doc)."""
    fitted = {}
    for backend in args.runtimes:
        rows, moe = _moe_rows(fit, backend, args.ttft_rows or 40)
        if not moe:
            continue
        rt = get_runtime(backend)
        scores = {e: _intercept_score(_ttft_pairs(moe, rt.with_overrides(moe_gemm_efficiency=e)))
                  for e in GRID_MOE_GEMM_EFFICIENCY}
        print(f"{backend:9s} moe_gemm_efficiency " + "  ".join(f"{e:g}:{v:.3f}" for e, v in scores.items()),
              flush=True)
        eff = min(scores, key=scores.get)
        rt = rt.with_overrides(moe_gemm_efficiency=eff)
        request_s, ttft_score, ttft_rows = _request_on_harness(rows, rt, args.ttft_rows or 40)
        print(f"{backend}: moe_gemm_efficiency = {eff:g} ({len(moe)} MoE rows, median |log error| of TTFT "
              f"{scores[eff]:.3f} at its own request delay); request_s = {request_s * 1e3:g} ms ({ttft_rows} "
              f"harness rows, TTFT {ttft_score:.3f})", flush=True)
        fitted[backend] = {"moe_gemm_efficiency": eff, "moe_rows": len(moe), "moe_ttft_median_abs_log_error":
                           scores[eff], "request_s": request_s, "ttft_median_abs_log_error": ttft_score,
                           "ttft_rows": ttft_rows}
    print(dumps(fitted))
    return fitted


def _fit_moe(fit: list, args) -> dict:
    """``moe_memory_efficiency`` and ``moe_layer_s`` per runtime on its MoE rows' TPOT, then
    ``request_s`` on its harness rows' TTFT (module doc)."""
    fitted = {}
    for backend in args.runtimes:
        rows, moe = _moe_rows(fit, backend, args.rows or 24)
        if not moe:
            continue
        rt = get_runtime(backend)
        scores = {(e, s): _score(moe, rt.with_overrides(moe_memory_efficiency=e, moe_layer_s=s))
                  for e in GRID_MOE_EFFICIENCY for s in GRID_MOE_LAYER_S}
        for e in GRID_MOE_EFFICIENCY:
            print(f"{backend:9s} moe_memory_efficiency {e:<4g} moe_layer_s " + "  ".join(
                f"{s * 1e6:g}us:{scores[e, s]:.3f}" for s in GRID_MOE_LAYER_S), flush=True)
        (eff, layer_s), score = min(scores.items(), key=lambda kv: kv[1])
        rt = rt.with_overrides(moe_memory_efficiency=eff, moe_layer_s=layer_s)
        request_s, ttft_score, ttft_rows = _request_on_harness(rows, rt, args.ttft_rows or 40)
        print(f"{backend}: moe_memory_efficiency = {eff:g}, moe_layer_s = {layer_s * 1e6:g} us ({len(moe)} MoE "
              f"rows, median |log error| of TPOT {score:.3f}); request_s = {request_s * 1e3:g} ms ({ttft_rows} "
              f"rows, TTFT {ttft_score:.3f})", flush=True)
        fitted[backend] = {"moe_memory_efficiency": eff, "moe_layer_s": layer_s, "request_s": request_s,
                           "median_abs_log_error": score, "rows": len(moe),
                           "ttft_median_abs_log_error": ttft_score, "ttft_rows": ttft_rows}
    print(dumps(fitted))
    return fitted


def _fit_cases(data: Path | None) -> list:
    """The fit rows to use, each measurement once (module doc): with ``data``, every row of it, a test row
    refused (:class:`BadInput`); without, the shipped sample's fit split."""
    path = data or _DATA
    if not path.is_file():
        raise BadInput(f"--data {path}: no such file")
    every = load_cases(path)
    test = [c for c in every if split_of(c.row) != "fit"]
    if data is not None and test:
        models = sorted({(c.row.get("model_path") or "").strip() for c in test})
        raise BadInput(f"error: --data {path}: {len(test)} test row(s) (models not in FIT_MODELS: "
                       f"{', '.join(models[:4])}{', ...' if len(models) > 4 else ''}); fit on fit rows only "
                       "(score test rows with the study)")
    every = [c for c in every if split_of(c.row) == "fit"]
    cases = [c for c, dup in zip(every, duplicates(every), strict=True) if not c.skip and not dup]  # each run once
    where = f"{path}" if data is not None else f"the shipped sample's fit split (models of FIT_MODELS: {len(FIT_MODELS)})"
    print(f"{len(cases)} fit rows of {where}")
    return cases


def _recorded(cases: list, args, overrides: dict | None = None) -> list:
    """``(case, Recording)`` of the cases that replay (:mod:`.host_replay`), each recorded once, journaled
    under ``--out``; the others are named."""
    store = args.out / ("recordings" if not overrides else "recordings-" + "-".join(f"{k}={v:g}" for k, v in
                                                                                  sorted(overrides.items())))
    out = []
    for case, rec in zip(cases, record_rows(cases, args.jobs, store, fingerprint(args.data or _DATA), overrides),
                         strict=True):
        if isinstance(rec, Recording):
            out.append((case, rec))
        else:
            print(f"  not re-timed: {case.row.get('id', '')}: {rec}")
    return out


def _print_host(backend: str, fit: dict) -> None:
    for s in GRID_S:
        print(f"{backend:9s} step_host_s {s * 1e3:4g} ms, per sequence " + "  ".join(
            f"{q * 1e6:g}us:{fit['scores'][s, q]:.3f}" for q in GRID_PER_SEQ_S), flush=True)
    for k in GRID_TOKENIZE_S_PER_TOKEN:
        print(f"{backend:9s} tokenize {k * 1e6:g} us/token, request_s " + "  ".join(
            f"{v * 1e3:g}ms:{fit['ttft_scores'][v, k]:.3f}" for v in GRID_REQUEST_S), flush=True)


def _fit_runtime(mine: list, backend: str, args) -> dict:
    """One runtime's host constants and request path (module doc); TensorRT-LLM's all-reduce latency too."""
    rt = get_runtime(backend)
    if args.only_request:
        out = {"step_host_s": rt.step_host_s, "step_host_per_seq_s": rt.step_host_per_seq_s}
        return out | fit_request(_recorded(mine, args), rt.step_host_s, rt.step_host_per_seq_s)
    if backend != "trtllm":
        fit = fit_host(_recorded(mine, args))
        _print_host(backend, fit)
        return fit
    fits = {}
    for ar in GRID_CUSTOM_AR_S:  # GPU time: each latency recorded on its own (module doc)
        fits[ar] = fit_host(_recorded(mine, args, _host_field("custom_ar_s", ar)))
        print(f"{backend:9s} custom_ar_s {ar * 1e6:g} us: median |log error| of TPOT "
              f"{fits[ar]['median_abs_log_error']:.3f}", flush=True)
    ar = min(fits, key=lambda v: fits[v]["median_abs_log_error"])
    _print_host(backend, fits[ar])
    return fits[ar] | {"custom_ar_s": ar}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="fit rows only (default: the shipped sample's)")
    parser.add_argument("--rows", type=count, default=None,
                        help="at most this many fit rows per runtime, spread evenly (default: every one; --moe: 24)")
    parser.add_argument("--ttft-rows", type=count, default=None, help="--moe, --moe-prefill: rows for request_s (40)")
    parser.add_argument("--only-request", action="store_true", help="fit request_s alone (module doc)")
    parser.add_argument("--moe", action="store_true", help="fit the MoE block's two constants (module doc)")
    parser.add_argument("--moe-prefill", action="store_true",
                        help="fit the grouped expert kernels' rate at prefill sizes (module doc)")
    parser.add_argument("--runtimes", nargs="+", choices=_RUNTIMES, default=list(_RUNTIMES),
                        help="fit these runtime profiles only (the others keep their values)")
    parser.add_argument("--jobs", type=count, default=2, help="processes (>= 1)")
    parser.add_argument("--write", type=Path, default=None,
                        help="also write the fitted values as JSON there (the shipped request path: "
                             "validation/data/serving_request_path_fit.json, held equal to the profiles by a test)")
    parser.add_argument("--out", type=Path, default=Path("outputs/fit_serving"),
                        help="where each row's recording is journaled (module doc)")
    args = parser.parse_args(argv)
    fit = _fit_cases(args.data)
    if args.moe:
        return _fit_moe(fit, args)
    if args.moe_prefill:
        return _fit_moe_prefill(fit, args)
    fitted = {}
    for backend in args.runtimes:
        mine = host_rows(fit, backend)
        if not mine:
            print(f"{backend}: no fit rows")
            continue
        found = _fit_runtime(_spread(mine, args.rows) if args.rows else mine, backend, args)
        fitted[backend] = {k: v for k, v in found.items() if not k.endswith("scores")}
        print(f"{backend}: step_host_s = {found['step_host_s'] * 1e3:g} ms, step_host_per_seq_s = "
              f"{found['step_host_per_seq_s'] * 1e6:g} us (median |log error| of TPOT "
              f"{found.get('median_abs_log_error', math.nan):.3f} on {found.get('rows', 0)} rows); request_s = "
              f"{found['request_s'] * 1e3:g} ms, tokenize_s_per_token = {found['tokenize_s_per_token'] * 1e6:g} us "
              f"({found['ttft_rows']} {found['ttft_client']} rows, TTFT "
              f"{found['ttft_median_abs_log_error']:.3f})", flush=True)
    if args.write:
        atomic_write_text(args.write, dumps(fitted, indent=2) + "\n")
    print(dumps(fitted))
    return fitted


if __name__ == "__main__":
    run_script(main)
