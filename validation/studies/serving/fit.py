"""Fit each serving runtime's host time per step on the fit set of the measured serving runs.

``python -m validation.studies.serving.fit [--data CSV] [--rows N]``: for each runtime profile (vLLM sync and
overlapped, SGLang, TensorRT-LLM; a profile with no fit rows is left as it is), its physical host
parameters: its host time per step (``RuntimeProfile.step_host_s``,
fixed: scheduling and launch bookkeeping; ``step_host_per_seq_s``, per running sequence: its inputs,
sampling bookkeeping, detokenizing and streaming) and, for TensorRT-LLM only, its small all-reduce kernel's
fixed latency (``custom_ar_s``, which it takes for one-shot and two-shot alike: no published timing of
its fused kernel; vLLM's and SGLang's two latencies are fitted on their kernels' published timings by
``python -m validation.studies.collectives.fit_custom_allreduce``), are chosen on grids, one after the other twice (coordinate descent), to minimise the median of ``|log(simulated / measured)|`` of the mean TPOT
of that backend's fit-set rows (the host time per step sets TPOT; TTFT is mostly queueing) (the models of :data:`validation.studies.serving.FIT_MODELS`; at most
``--rows`` of them, spread evenly). Test-set rows are refused: the fit never sees them. Prints the chosen
values (copy them into ``simcore/serving/runtime.py``) and ends with one JSON line.

Then a fourth, the runtime's request path (``RuntimeProfile.request_s``: HTTP, tokenization, hand-off to
the scheduler, the first token's way back), on the median ``|log|`` error of the mean TTFT of the same
runtime's fit rows (``--ttft-rows`` of them) measured by the client the study simulates: InferenceX's
(rows at its lengths, :data:`validation.studies.serving.launch.HARNESS_LENGTHS`). The other fit rows
(aiconfigurator's own sweeps, ISL 1000-8000) come from a client whose warm-up, ramp and TTFT
definition are not documented, so their TTFT cannot tell the request path from the client's. It adds to every TTFT, so each row is simulated once
without it and the grid is scored on ``simulated + request_s``; that the delay before the scheduler
barely changes a closed loop's load is what the study's full runs (which simulate it) confirm.
``--only-request`` keeps the three host constants as they are and fits this one alone.

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

from simcore.files import dumps
from simcore.serving import get_runtime
from validation.studies.common.cli import count
from validation.studies.serving import duplicates, load_cases, simulate_case, split_of
from validation.studies.serving.launch import HARNESS_LENGTHS

__all__ = ["main", "GRID_S"]

GRID_S = (0.0, 1e-3, 2e-3, 4e-3, 6e-3, 9e-3, 12e-3)
GRID_PER_SEQ_S = (0.0, 10e-6, 20e-6, 40e-6, 60e-6, 90e-6)
GRID_CUSTOM_AR_S = (3e-6, 6e-6, 9e-6, 14e-6, 20e-6)
GRID_REQUEST_S = (0.0, 10e-3, 20e-3, 30e-3, 45e-3, 60e-3, 80e-3, 100e-3, 130e-3, 160e-3, 200e-3, 250e-3, 300e-3)
GRID_MOE_EFFICIENCY = (1.0, 0.85, 0.7, 0.5, 0.35)
GRID_MOE_LAYER_S = (0.0, 25e-6, 50e-6, 75e-6, 100e-6, 125e-6, 150e-6)
GRID_MOE_GEMM_EFFICIENCY = (0.7, 0.5, 0.35, 0.25, 0.18, 0.12)
_DATA = Path(__file__).resolve().parents[2] / "data" / "serving_h200_measured.csv"
_RUNTIMES = ("vllm-sync", "vllm", "sglang", "trtllm")


def _host_grids(backend: str) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """The host constants fitted for a runtime (module doc): the all-reduce latency for TensorRT-LLM only."""
    grids = (("step_host_s", GRID_S), ("step_host_per_seq_s", GRID_PER_SEQ_S))
    return grids + ((("custom_ar_s", GRID_CUSTOM_AR_S),) if backend == "trtllm" else ())


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
        rows, moe = _moe_rows(fit, backend, args.ttft_rows)
        if not moe:
            continue
        rt = get_runtime(backend)
        scores = {e: _intercept_score(_ttft_pairs(moe, rt.with_overrides(moe_gemm_efficiency=e)))
                  for e in GRID_MOE_GEMM_EFFICIENCY}
        print(f"{backend:9s} moe_gemm_efficiency " + "  ".join(f"{e:g}:{v:.3f}" for e, v in scores.items()),
              flush=True)
        eff = min(scores, key=scores.get)
        rt = rt.with_overrides(moe_gemm_efficiency=eff)
        request_s, ttft_score, ttft_rows = _request_on_harness(rows, rt, args.ttft_rows)
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
        rows, moe = _moe_rows(fit, backend, args.rows)
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
        request_s, ttft_score, ttft_rows = _request_on_harness(rows, rt, args.ttft_rows)
        print(f"{backend}: moe_memory_efficiency = {eff:g}, moe_layer_s = {layer_s * 1e6:g} us ({len(moe)} MoE "
              f"rows, median |log error| of TPOT {score:.3f}); request_s = {request_s * 1e3:g} ms ({ttft_rows} "
              f"rows, TTFT {ttft_score:.3f})", flush=True)
        fitted[backend] = {"moe_memory_efficiency": eff, "moe_layer_s": layer_s, "request_s": request_s,
                           "median_abs_log_error": score, "rows": len(moe),
                           "ttft_median_abs_log_error": ttft_score, "ttft_rows": ttft_rows}
    print(dumps(fitted))
    return fitted


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--rows", type=count, default=24, help="fit rows per backend (spread evenly)")
    parser.add_argument("--ttft-rows", type=count, default=40, help="fit rows per backend for request_s")
    parser.add_argument("--only-request", action="store_true", help="fit request_s alone (module doc)")
    parser.add_argument("--moe", action="store_true", help="fit the MoE block's two constants (module doc)")
    parser.add_argument("--moe-prefill", action="store_true",
                        help="fit the grouped expert kernels' rate at prefill sizes (module doc)")
    parser.add_argument("--runtimes", nargs="+", choices=_RUNTIMES, default=list(_RUNTIMES),
                        help="fit these runtime profiles only (the others keep their values)")
    args = parser.parse_args(argv)
    every = load_cases(args.data)
    cases = [c for c, dup in zip(every, duplicates(every), strict=True) if not c.skip and not dup]  # each run once
    test = [c for c in cases if split_of(c.row) != "fit"]
    fit = [c for c in cases if split_of(c.row) == "fit"]
    print(f"{len(fit)} fit rows used, {len(test)} test rows refused (never simulated here)")
    if args.moe:
        return _fit_moe(fit, args)
    if args.moe_prefill:
        return _fit_moe_prefill(fit, args)
    fitted = {}
    for backend in args.runtimes:
        mine = _runtime_rows(fit, backend)
        if not mine:
            print(f"{backend}: no fit rows")
            continue
        rt = get_runtime(backend)
        request_s, ttft_score, ttft_rows = _request_on_harness(mine, rt, args.ttft_rows)
        rt = rt.with_overrides(request_s=request_s)
        print(f"{backend}: request_s = {request_s * 1e3:g} ms ({ttft_rows} rows, median |log error| of TTFT "
              f"{ttft_score:.3f})")
        mine = _spread(mine, args.rows)
        score = _score(mine, rt) if args.only_request else math.inf
        for _ in range(0 if args.only_request else 2):
            for field, grid in _host_grids(backend):
                scores = {v: _score(mine, rt.with_overrides(**_host_field(field, v))) for v in grid}
                best = min(scores, key=scores.get)
                rt, score = rt.with_overrides(**_host_field(field, best)), scores[best]
                print(f"{backend:7s} {field:20s} " + "  ".join(f"{v * 1e3:g}ms:{e:.3f}" for v, e in scores.items()),
                      flush=True)
        fitted[backend] = {"step_host_s": rt.step_host_s, "step_host_per_seq_s": rt.step_host_per_seq_s,
                           "custom_ar_s": rt.custom_ar_s, "request_s": rt.request_s,
                           "median_abs_log_error": score, "rows": len(mine),
                           "ttft_median_abs_log_error": ttft_score, "ttft_rows": ttft_rows}
        print(f"{backend}: step_host_s = {rt.step_host_s * 1e3:g} ms, step_host_per_seq_s = "
              f"{rt.step_host_per_seq_s * 1e6:g} us ({len(mine)} rows, median |log error| {score:.3f})")
    print(dumps(fitted))
    return fitted


if __name__ == "__main__":
    main()
