"""Fit Gated DeltaNet's two kernel constants on timings of flash-linear-attention's own kernels.

``python -m validation.studies.attention.fit_linear [--data CSV] [--gpu h100-sxm] [--hold-out-tp N] [--no-fit]``

Reads rows of the kernels CSV schema whose ``kernel`` is ``gdn recurrent decode`` or ``gdn chunked
prefill`` and whose ``shape_or_size`` holds ``key=value`` sizes per GPU (``seqs new hk hv dk dv
state_bytes``), as :mod:`validation.studies.attention.measure_linear` writes them, and prices each with
:func:`simcore.models.linear_attention.core_time_s`, the function the lowering calls for a hybrid model's
token mixer. Its two constants are fitted on grids, each on the rows of the regime it governs (median
|log error|): the share of peak HBM bandwidth the delta-rule kernels reach (``GDN_HBM_EFFICIENCY``) on
the decode rows (one memory-bound kernel), then the serial time per chunk of the chunked form's state
pass (``GDN_CHUNK_LATENCY_S``) on the prefill rows at that share.

Split: test rows (``validation.studies.common.split``) are refused: constants are fitted on fit rows only. The shipped
file is one source, so all of it is fit; as a cross-check (same source, not a test split, and labelled
so) ``--hold-out-tp N`` fits on the other degrees and scores the degree-``N`` rows. Rows with a
BF16 state are listed but neither fitted nor scored: fla's standalone kernels write an FP32 final state
whatever the input's dtype, while serving runtimes update the state in place at its own dtype, so such a
timing is not the served kernel's. (The timing script's ``causal conv1d update`` rows are not read:
fla's own update kernel, where vLLM and SGLang ship their own.) Sets nothing (the constants live in ``simcore/models/linear_attention.py``);
ends with one JSON line. Bad input (missing file or column, no usable rows, unknown GPU): one line, exit 2.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import types
from pathlib import Path

import numpy as np

from simcore.files import dumps
from simcore.hardware.gpus import get_gpu
from simcore.models import linear_attention as gdn
from validation.studies.common import read_csv
from validation.studies.common.split import split_of

__all__ = ["BadInput", "load_rows", "model_s", "fit", "main"]

DATA = Path(__file__).resolve().parents[2] / "data" / "kernels_h100_gdn_measured.csv"
KERNELS = {"gdn recurrent decode": "decode", "gdn chunked prefill": "prefill"}
SIZES = ("seqs", "new", "hk", "hv", "dk", "dv", "state_bytes")
EFFICIENCIES = [round(0.40 + 0.01 * i, 2) for i in range(61)]
LATENCIES_S = [round(0.1 * i, 1) * 1e-6 for i in range(41)]


class BadInput(ValueError):
    """Input the fit cannot use; the message names what."""


def load_rows(path: Path) -> list[dict]:
    """The delta-rule rows of ``path``: phase, sizes, measured seconds, tensor-parallel degree."""
    if not path.is_file():
        raise BadInput(f"--data: no such file {path}")
    try:
        _, raw = read_csv(path, ("kernel", "shape_or_size", "unit", "value"), "--data")
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    rows = []
    for line, r in enumerate(raw, start=2):
        if r["kernel"] not in KERNELS:
            continue
        fields = dict(part.split("=", 1) for part in r["shape_or_size"].split() if "=" in part)
        absent = [k for k in SIZES if k not in fields]
        if absent:
            raise BadInput(f"--data: line {line}: shape_or_size lacks {', '.join(absent)}")
        if r["unit"] != "us":
            raise BadInput(f"--data: line {line}: unit {r['unit']!r}, expected 'us'")
        try:
            sizes = {k: int(fields[k]) for k in SIZES}
            seconds = float(r["value"]) * 1e-6
        except ValueError as err:
            raise BadInput(f"--data: line {line}: {err}") from None
        if seconds <= 0 or min(sizes.values()) < 1:
            raise BadInput(f"--data: line {line}: sizes and value must be positive")
        rows.append({"line": line, "phase": KERNELS[r["kernel"]], "tp": int(fields.get("tp", 1)),
                     "split": split_of(r),
                     "model": fields.get("model", "?"), "seconds": seconds, **sizes})
    if not rows:
        raise BadInput(f"--data: {path} has no rows of kernel {' or '.join(map(repr, KERNELS))}")
    return rows


def model_s(r: dict, gpu, hbm_share: float, chunk_latency_s: float) -> float:
    """The cost model's time for one row (its sizes are per GPU already: no head split)."""
    m = types.SimpleNamespace(linear_key_heads=r["hk"], linear_value_heads=r["hv"], linear_key_head_dim=r["dk"],
                              linear_value_head_dim=r["dv"], linear_state_bytes=r["state_bytes"])
    new = 1.0 if r["phase"] == "decode" else float(r["new"])
    time, _ = gdn.core_time_s(m, gpu, "bf16", np, r["phase"], float(r["seqs"]), new, 0.0, 1.0, 2.0,
                              hbm_share, chunk_latency_s)
    return float(time)


def _median_abs_log(rows: list[dict], gpu, share: float, latency: float) -> float:
    return statistics.median(abs(math.log(model_s(r, gpu, share, latency) / r["seconds"])) for r in rows)


def fit(rows: list[dict], gpu) -> tuple[float, float]:
    """(HBM share, chunk latency in s) on ``rows``, each from the regime it governs: the share on the
    bandwidth-bound decode rows (one memory-bound kernel, no chain), then the latency on the prefill rows
    at that share; each by the median |log error| on its grid, ties to the smaller value."""
    # the share from decode rows whose state traffic dwarfs a kernel's fixed cost (at full bandwidth, four
    # times it): below that the row times the launch, not the bandwidth
    decode = [r for r in rows if r["phase"] == "decode"
              and model_s(r, gpu, 1.0, 0.0) >= 5 * gpu.kernel_overhead_s]
    prefill = [r for r in rows if r["phase"] == "prefill"]
    if not decode or not prefill:
        raise BadInput("--data: the fit needs decode and prefill rows with an FP32 state")
    share = min((_median_abs_log(decode, gpu, e, 0.0), e) for e in EFFICIENCIES)[1]
    latency = min((_median_abs_log(prefill, gpu, share, t), t) for t in LATENCIES_S)[1]
    return share, latency


def _score(rows: list[dict], gpu, share: float, latency: float) -> dict:
    if not rows:
        return {"rows": 0}
    errors = [model_s(r, gpu, share, latency) / r["seconds"] - 1.0 for r in rows]
    return {"rows": len(rows), "median_abs_log_error": round(_median_abs_log(rows, gpu, share, latency), 4),
            "median_signed_error": round(statistics.median(errors), 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="kernels-schema CSV (default: the shipped H100 file)")
    parser.add_argument("--gpu", default="h100-sxm", help="catalog GPU the rows were timed on")
    parser.add_argument("--hold-out-tp", type=int, default=0,
                        help="cross-check: fit without this tensor-parallel degree's rows and score them (0: none)")
    parser.add_argument("--no-fit", action="store_true", help="score the shipped constants, fit nothing")
    args = parser.parse_args(argv)
    try:
        gpu = get_gpu(args.gpu)
    except (KeyError, ValueError) as err:
        print(f"error: --gpu: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        rows = load_rows(args.data)
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tests = [r["line"] for r in rows if r["split"] == "test"]
    if tests:
        print(f"error: --data: {len(tests)} test row(s) (split=test, lines {', '.join(map(str, tests[:5]))}); "
              "fit on fit rows only", file=sys.stderr)
        return 2
    served = [r for r in rows if r["state_bytes"] == 4]
    fit_rows = [r for r in served if r["tp"] != args.hold_out_tp]
    test_rows = [r for r in served if r["tp"] == args.hold_out_tp]
    if not fit_rows:
        print("error: --data: no FP32-state rows to fit on", file=sys.stderr)
        return 2
    shipped = (gdn.GDN_HBM_EFFICIENCY, gdn.GDN_CHUNK_LATENCY_S)
    share, latency = shipped
    if not args.no_fit:
        try:
            share, latency = fit(fit_rows, gpu)
        except BadInput as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    for r in rows:
        used = "held out" if r in test_rows else "fit" if r in fit_rows else "not used (BF16 state)"
        print(f"line {r['line']:3d} {r['model']:<20} tp {r['tp']} {r['phase']:<7} seqs {r['seqs']:4d} new {r['new']:6d} "
              f"measured {r['seconds'] * 1e6:8.1f} us  model {model_s(r, gpu, share, latency) * 1e6:8.1f} us  {used}")
    result = {"gpu": args.gpu, "hbm_share": share, "chunk_latency_s": latency,
              "fit": _score(fit_rows, gpu, share, latency), "hold_out_tp": args.hold_out_tp,
              "test": _score(test_rows, gpu, share, latency),
              "shipped": {"hbm_share": shipped[0], "chunk_latency_s": shipped[1],
                          "fit": _score(fit_rows, gpu, *shipped), "test": _score(test_rows, gpu, *shipped)},
              "before": {"hbm_share": gpu.hbm_efficiency, "chunk_latency_s": 0.0,
                         "fit": _score(fit_rows, gpu, gpu.hbm_efficiency, 0.0),
                         "test": _score(test_rows, gpu, gpu.hbm_efficiency, 0.0)},
              "not_used_bf16_state": len(rows) - len(served)}
    print(f"{'scored' if args.no_fit else 'fitted'}: HBM share {share:.2f}, chunk latency {latency * 1e6:.1f} us; "
          f"fit rows (in sample) {result['fit']}, held out of the fit (tp {args.hold_out_tp}, same source) "
          f"{result['test']}; before (streaming share "
          f"{gpu.hbm_efficiency}, no chain): fit {result['before']['fit']}, held out {result['before']['test']}")
    print(dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
