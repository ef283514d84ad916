"""DeepSeek-R1 on TensorRT-LLM with and without MTP: the InferenceX rows of the serving sample, both launches.

InferenceX runs DeepSeek-R1 FP8 on H200 with TensorRT-LLM twice, without speculative decoding
(``dsr1_fp8_h200_trt.sh``) and with MTP (``dsr1_fp8_h200_trt_mtp.sh``: 3 draft tokens without attention
DP, 1 with; :func:`validation.studies.serving.launch.deepseek_trtllm_mtp_flags`), and a row of the
sample does not record which one ran it. ``shard-validate study=serving`` simulates every row without;
this script simulates each such row under both launches (acceptance: aiconfigurator's default rates,
:mod:`simcore.serving.speculative`; nothing fitted) and prints the TPOT and TTFT error of each, grouped by
the campaign (measurement date) the row came from, so the reader sees which launch each campaign's
rows follow. It selects no rows by their error: every non-duplicate aggregated DeepSeek-R1 TensorRT-LLM
row at InferenceX's lengths is shown.

    python -m validation.serving_spec [--data CSV] [--jobs 2]

Ends with one JSON line: per launch, the median |error| of TPOT and TTFT over all these rows and per
campaign.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from simcore.serving import get_runtime
from validation.studies.serving import duplicates, load_cases, simulate_case
from validation.studies.serving.launch import HARNESS_LENGTHS, deepseek_trtllm_mtp_flags

DATA = Path(__file__).resolve().parent / "data" / "serving_h200_measured.csv"


def _rows(data: Path):
    cases = load_cases(data)
    return [c for c, dup in zip(cases, duplicates(cases), strict=True)
            if not c.skip and not dup and c.row["backend"] == "trtllm" and c.row["mode"] == "agg"
            and "DeepSeek-R1" in c.row["model_path"] and c.isl in HARNESS_LENGTHS and c.osl in HARNESS_LENGTHS]


def _campaign(row: dict) -> str:
    m = re.search(r"measured=(\d{4}-\d{2}-\d{2})", row.get("silicon_data_source", ""))
    return m.group(1) if m else "?"


def _one(args):
    data, i, mtp = args
    case = _rows(Path(data))[i]
    rt = get_runtime(case.runtime).with_overrides(**case.launch)
    if mtp:
        pool = case.plan.pool.strategy
        rt = rt.with_overrides(**deepseek_trtllm_mtp_flags(case.concurrency, case.isl, pool.tp * pool.ep, pool.ep > 1))
    ttft, tpot, why = simulate_case(case, rt)
    return i, mtp, ttft, tpot, why


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    cases = _rows(args.data)
    jobs = [(str(args.data), i, mtp) for i in range(len(cases)) for mtp in (False, True)]
    with ProcessPoolExecutor(max(args.jobs, 1)) as ex:
        results = {(i, mtp): (t, p, w) for i, mtp, t, p, w in ex.map(_one, jobs)}
    err: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    print(f"{'row':58s} {'campaign':10s} {'c':>4s} {'TPOT ms':>8s} {'plain':>7s} {'MTP':>7s}   TTFT err plain / MTP")
    for i, c in enumerate(cases):
        meas_t, meas_p = float(c.row["silicon_ttft_ms"]), float(c.row["silicon_tpot_ms"])
        line = []
        for mtp in (False, True):
            t, p, why = results[(i, mtp)]
            e = (t * 1e3 / meas_t - 1, p * 1e3 / meas_p - 1)
            err.setdefault((_campaign(c.row), mtp), []).append(e)
            err.setdefault(("all", mtp), []).append(e)
            line.append(e)
        print(f"{c.row['id'][-58:]:58s} {_campaign(c.row):10s} {c.concurrency:4d} {meas_p:8.2f} {line[0][1]:+7.2f} "
              f"{line[1][1]:+7.2f}   {line[0][0]:+.2f} / {line[1][0]:+.2f}")
    summary = {}
    for (campaign, mtp), es in sorted(err.items()):
        key = f"{campaign} {'mtp' if mtp else 'plain'}"
        summary[key] = {"rows": len(es), "tpot_median_abs": statistics.median(abs(p) for _, p in es),
                        "ttft_median_abs": statistics.median(abs(t) for t, _ in es)}
        print(f"{key:20s} rows {len(es):3d}  median |TPOT err| {summary[key]['tpot_median_abs']:.3f}  "
              f"|TTFT err| {summary[key]['ttft_median_abs']:.3f}")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
