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

It then sets the simulator's decode speedup from speculation beside published ones
(``validation/data/spec_decode_published.csv``: SGLang's DeepSeek-V3 MTP on 8 H200, 1.8x at batch 1 and
1.5x at batch 32): one decode step of the batch at a 2,048-token context, plain against speculative at 1
and 3 draft tokens with the default acceptance. The source states neither its draft count, its acceptance
nor its lengths, so this is a consistency check, not a validation.

    python -m validation.studies.serving.speculative [--data CSV] [--jobs 2]

Ends with one JSON line: per launch, the median |error| of TPOT and TTFT over all these rows and per
campaign, and the published and simulated speedups.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.files import dumps
from simcore.models import get_model
from simcore.serving import GroupBatch, StepCost, get_runtime, runtime_strategy
from simcore.workload import Workload
from validation.studies.serving import duplicates, load_cases, simulate_case
from validation.studies.serving.launch import HARNESS_LENGTHS, deepseek_trtllm_mtp_flags

DATA = Path(__file__).resolve().parents[2] / "data" / "serving_h200_measured.csv"
PUBLISHED = Path(__file__).resolve().parents[2] / "data" / "spec_decode_published.csv"
CONTEXT = 2048  # tokens each decoding sequence attends to in the speedup check (the source gives none)


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


def decode_speedup(model: str, hardware: str, tp: int, runtime: str, batch: int, spec_tokens: int) -> float:
    """Plain decode step time over speculative step time per token kept, one step of ``batch`` sequences
    at :data:`CONTEXT` tokens, each step at least its host time (the runtimes overlap it)."""
    ctx = CostContext(get_model(model), Workload(precision="fp8"), Cluster.simple(hardware, tp))
    plain, spec = get_runtime(runtime), get_runtime(runtime).with_overrides(spec_tokens=spec_tokens)
    q = 1 + spec_tokens

    def step(rt, q):
        cost = StepCost(ctx, runtime_strategy(tp=tp), rt)
        return max(sum(cost.gpu_times([GroupBatch.of([], [CONTEXT] * batch, batch * q, q)], rt)), rt.host_s(batch))

    return step(plain, 1) / (step(spec, q) / spec.tokens_per_step)


def _published(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        sims = {f"k{k}": decode_speedup(r["model"], r["hardware"], int(r["tp"]), r["runtime"], int(r["batch"]), k)
                for k in (1, 3)}
        out.append({"model": r["model"], "runtime": r["runtime"], "batch": int(r["batch"]),
                    "published": float(r["value"]), "simulated": sims})
        print(f"{r['model']} {r['runtime']} {r['hardware']} TP {r['tp']} batch {r['batch']:>3}: published "
              f"{float(r['value']):.2f}x, simulated {sims['k1']:.2f}x (1 draft) / {sims['k3']:.2f}x (3 drafts)")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    if not args.data.is_file():
        ap.exit(2, f"error: --data: file not found: {args.data}\n")
    try:
        cases = _rows(args.data)
    except (KeyError, ValueError) as exc:  # a CSV not in the serving schema
        ap.exit(2, f"error: --data {args.data.name}: not in the serving sample's schema ({exc})\n")
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
    summary["published_speedups"] = _published(PUBLISHED)
    print(dumps(summary))
    return summary


if __name__ == "__main__":
    main()
