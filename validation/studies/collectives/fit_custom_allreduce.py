"""Fit the serving runtimes' own all-reduce latencies on published timings of those kernels.

``python -m validation.studies.collectives.fit_custom_allreduce [--data CSV] [--no-fit]``

vLLM and SGLang run a tensor-parallel group's small and mid-size all-reduces on their own NVLink kernels
rather than NCCL's: ``custom_all_reduce`` (one-shot, "1stage": every GPU reads its peers' buffers after
one barrier; two-shot, "2stage": a reduce-scatter then an all-gather, a barrier each) and, since
vllm-project/vllm PR #24111, PyTorch's symmetric-memory all-reduce (two-shot, or NVLink-SHARP
``multimem`` at 6 and 8 GPUs), dispatched by size to whichever is fastest (SGLang runs vLLM's kernel since
sgl-project/sglang PR #5079). The serving simulator prices that all-reduce as the faster of

    one-shot:  RuntimeProfile.custom_ar_s    + (n - 1) x S / B
    two-shot:  RuntimeProfile.two_shot_ar_s  + 2 (n - 1) / n x S / B

(:func:`simcore.serving.step_cost.custom_all_reduce_time_s`) with ``B`` NVLink's bandwidth at the
collectives' NVLink efficiency, not fitted here. The two fixed latencies (the barriers' flag exchanges,
the kernels' launch and tail) are fitted jointly on a grid, minimising the median ``|log(model /
measured)|`` over the fit rows of ``validation/data/allreduce_runtime_published.csv``. Each measurement
point (source, GPU count, size) counts once, at the fastest of the runtime's kernels the source timed
(NCCL's columns are not the runtime's own kernel and are left out), as the runtimes' size dispatch was
tuned to pick it. The rows (their ``note`` says how each was read):

- sgl-project/sglang PR #2904 (fit): SGLang's custom all-reduce on H100, 2 / 4 / 8 GPUs, 8 KiB to 4 MiB,
  timed without CUDA graphs (the PR's heading): the one-shot regime's latency.
- vllm-project/vllm PR #24111 (fit): vLLM's ``benchmark_device_communicators.py`` on H100 (CUDA-graph
  replays), 2 / 4 / 6 GPUs, 0.5-4 MiB: one-shot, two-shot and symmetric-memory kernels.
- vllm-project/vllm PR #42324 (test): the same benchmark's SM 9.0 table of symmetric-memory kernels,
  0.5-8 MiB (its GPU count is inferred as 8), and vllm-project/vllm PR #24532 (test): 4 GPUs, GPU not named.

The latencies are fitted on the ``fit`` rows only (a row's ``split``, :func:`validation.studies.common.split.split_of`); the
``test`` rows are scored, out of sample. ``--no-fit`` scores the shipped vLLM values on both. Prints the fit, each point's model and measured time, and one JSON line.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from simcore.files import dumps
from simcore.hardware.gpus import H100_SXM
from simcore.serving import get_runtime
from simcore.serving.step_cost import custom_all_reduce_time_s
from validation.studies.common.cli import BadInput, read_rows, run_script
from validation.studies.common.split import split_of

__all__ = ["main", "load_points", "fit", "GRID_ONE_SHOT_S", "GRID_TWO_SHOT_S"]

_DATA = Path(__file__).resolve().parents[2] / "data" / "allreduce_runtime_published.csv"
_NEED = ("source_url", "world_size", "implementation", "size_bytes", "time_us")
#: the largest message the runtimes hand their own kernel (``RuntimeProfile.custom_ar_max_bytes``)
MAX_BYTES = 8 * 2**20
GRID_ONE_SHOT_S = tuple(x * 1e-6 for x in (2, 3, 3.5, 4, 4.5, 5, 6, 7, 8))
GRID_TWO_SHOT_S = tuple(x * 1e-6 for x in (6, 7, 8, 9, 10, 11, 12, 14))


def load_points(path: Path) -> list[dict]:
    """One point per (source, GPU count, size): the fastest of the runtime's own kernels the source timed."""
    rows = read_rows(path, _NEED)
    best: dict[tuple, dict] = {}
    for i, r in enumerate(rows, start=2):
        if "nccl" in r["implementation"].lower():
            continue
        try:
            n, size, t = int(r["world_size"]), float(r["size_bytes"]), float(r["time_us"]) * 1e-6
        except ValueError:
            raise BadInput(f"--data: {path} line {i}: world_size, size_bytes and time_us must be numbers") from None
        try:
            split = split_of(r)
        except ValueError as exc:
            raise BadInput(f"--data: {path} line {i}: {exc}") from None
        if n < 2 or size <= 0 or t <= 0:
            raise BadInput(f"--data: {path} line {i}: world_size must be >= 2, size_bytes and time_us > 0")
        if size > MAX_BYTES:
            continue
        key = (r["source_url"], n, size)
        if key not in best or t < best[key]["time_s"]:
            best[key] = {"source_url": r["source_url"], "n": n, "size_bytes": size, "time_s": t,
                         "implementation": r["implementation"], "split": split, "line": i}
    return list(best.values())


def model_s(p: dict, one_shot_s: float, two_shot_s: float) -> float:
    return custom_all_reduce_time_s(p["n"], p["size_bytes"], H100_SXM, one_shot_s, two_shot_s)


def score(points: list[dict], one_shot_s: float, two_shot_s: float) -> float:
    errors = [abs(math.log(model_s(p, one_shot_s, two_shot_s) / p["time_s"])) for p in points]
    return float(np.median(errors)) if errors else math.nan


def fit(points: list[dict]) -> tuple[float, float, float]:
    """``(one_shot_s, two_shot_s, median |log error|)`` on the grids (module doc)."""
    if not points:
        raise BadInput("--data: no fit rows of a runtime's own all-reduce up to 8 MiB")
    scores = {(a, b): score(points, a, b) for a in GRID_ONE_SHOT_S for b in GRID_TWO_SHOT_S}
    (a, b), e = min(scores.items(), key=lambda kv: (kv[1], kv[0]))
    return a, b, e


def _print_points(points: list[dict], one_shot_s: float, two_shot_s: float) -> None:
    for p in sorted(points, key=lambda p: (p["split"], p["source_url"], p["n"], p["size_bytes"])):
        m = model_s(p, one_shot_s, two_shot_s)
        print(f"  {p['split']:4s} {p['source_url'].split('/')[-1]:>6s} n={p['n']} {p['size_bytes'] / 1024:8.0f} KiB "
              f"measured {p['time_s'] * 1e6:6.1f} us ({p['implementation']})  model {m * 1e6:6.1f} us")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--no-fit", action="store_true", help="score the shipped values, fit nothing")
    args = parser.parse_args(argv)
    points = load_points(args.data)
    fit_points = [p for p in points if p["split"] == "fit"]
    test_points = [p for p in points if p["split"] == "test"]
    vllm = get_runtime("vllm")
    out: dict = {"data": str(args.data), "fit_points": len(fit_points), "test_points": len(test_points)}
    if args.no_fit:
        one, two = vllm.custom_ar_s, vllm.two_shot_ar_s
    else:
        one, two, err = fit(fit_points)
        out |= {"custom_ar_s": one, "two_shot_ar_s": two, "fit_median_abs_log_error": err}
        print(f"fit (in sample, {len(fit_points)} points): custom_ar_s = {one * 1e6:g} us, two_shot_ar_s = "
              f"{two * 1e6:g} us, median |log error| {err:.3f}")
    for name, pts in (("fit", fit_points), ("test", test_points)):
        out[f"{name}_median_abs_log_error"] = score(pts, one, two)
        print(f"{name}: {len(pts)} points, median |log error| {out[f'{name}_median_abs_log_error']:.3f} at "
              f"{one * 1e6:g} / {two * 1e6:g} us" + (" (in sample)" if name == "fit" else " (out of sample)"))
    for runtime in ("vllm", "sglang"):
        rt = get_runtime(runtime)
        out[f"{runtime}_shipped"] = {"custom_ar_s": rt.custom_ar_s, "two_shot_ar_s": rt.two_shot_ar_s,
                                     "fit_median_abs_log_error": score(fit_points, rt.custom_ar_s, rt.two_shot_ar_s),
                                     "test_median_abs_log_error": score(test_points, rt.custom_ar_s, rt.two_shot_ar_s)}
    _print_points(points, one, two)
    print(dumps(out))
    return out


if __name__ == "__main__":
    run_script(main)
