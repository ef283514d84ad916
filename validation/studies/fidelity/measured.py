"""Three-way fidelity: proxy, simulator and measurement, per regime, wherever measurements exist.

Each measured row is priced twice, by the roofline proxy's closed form and by the simulator, and
both are compared with the measurement (``rel_error = predicted / measured - 1``):

- **collectives** (multi-node rows of ``collectives_calibration.csv`` and ``collectives_test.csv``):
  proxy = the analytic formula (:func:`simcore.collectives.collective_time_s`), simulator = the flow
  engine (NCCL's chunks over channels on the topology's links, concurrent groups sharing them), both
  through :func:`validation.studies.collectives.simulate_case` with the row's harness overhead;
- **deepep** (``ep_alltoall_deepep.csv``): proxy = DeepEP's closed form for the busiest rank at the
  expected load of the benchmark's sampled uniform routing (:func:`validation.studies.moe.predict`,
  what the lowering prices under ``sim.routing.a2a=deepep`` with that routing), simulator = what the per-GPU engine runs for an MoE exchange under
  ``sim.routing.a2a=deepep``: a seeded sampled routing of the row's tokens, exchanged by DeepEP's
  kernels (:func:`simcore.moe.deepep_exchange.exchange`: the row's mode, normal or low latency, with the
  row's kernel version's constants) and run as flows on the row's GPUs and rail-optimized InfiniBand
  topology (:func:`simcore.moe.deepep_exchange.run_exchange`); the same draw priced with DeepEP's per-rank
  formula (:func:`simcore.moe.deepep.pair_times_s`, column ``sim_deepep``) splits the sampled
  routing's skew (cause ``skew``) from what the flows on the topology add (cause ``flows``);
- **inference** (``inference_*.csv``): proxy = :func:`simcore.cost.proxy.evaluate`, simulator =
  :func:`simcore.engine.simulate` (contention and overlap on), through
  :mod:`validation.studies.inference`'s row-to-strategy mapping.

Where simulator and proxy differ by more than ``DIFFER`` (5%), the row names which is closer to the
measurement and the cause of the departure (:mod:`.measured_report`). Every row carries
its split (``fit`` rows calibrated a constant, ``test`` rows did not). ``python -m
validation.studies.fidelity.measured [--quick] [--out DIR]`` writes ``measured.csv``,
``measured.json`` and the report's section, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import types
from pathlib import Path

import numpy as np
import simpy

from simcore.collectives import DEFAULT, Fabric
from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, simulate
from simcore.files import dumps
from simcore.hardware.gpus import get_gpu
from simcore.moe.deepep import DEFAULT_DEEPEP, pair_times_s
from simcore.moe.deepep_exchange import exchange, run_exchange
from simcore.moe.draws import draw_copies
from simcore.network.flownet import FlowNetwork
from topologies import build_topology
from validation.studies.collectives import load_rows, simulate_case
from validation.studies.collectives import parse_row as parse_collective_row
from validation.studies.common import atomic_write_text, write_csv
from validation.studies.common.split import split_of
from validation.studies.fidelity.explain import critical_split, deltas, dominant_cause, explain
from validation.studies.fidelity.measured_report import summarize, write_section
from validation.studies.inference import _graph, _metric
from validation.studies.inference import parse_row as parse_inference_row
from validation.studies.moe import bottleneck_bytes, load_cases, predict
from validation.studies.moe.model import BENCH_EXPERTS, BENCH_ROUTING

__all__ = ["DIFFER", "DATA", "collective_rows", "deepep_rows", "inference_rows", "run", "main"]

DIFFER = 0.05  # simulator and proxy "differ" above this relative gap
DATA = Path(__file__).resolve().parents[2] / "data"
_SEED = 0


def _row(regime: str, source: str, split: str, label: str, metric: str, measured: float, proxy: float,
         sim: float, cause: str = "", why: str = "", sim_deepep: float | None = None) -> dict:
    gap = sim / proxy - 1 if proxy else float("nan")
    p_err, s_err = proxy / measured - 1, sim / measured - 1
    differ = abs(gap) > DIFFER
    closer = ("simulator" if abs(s_err) < abs(p_err) else "proxy") if differ else ""
    return {"regime": regime, "source": source, "split": split, "case": label, "metric": metric,
            "measured": measured, "proxy": proxy, "sim": sim, "proxy_rel_error": p_err, "sim_rel_error": s_err,
            "sim_over_proxy": gap, "differ": differ, "closer": closer, "cause": cause if differ else "",
            "why": why if differ else "", "sim_deepep": "" if sim_deepep is None else sim_deepep,
            "sim_deepep_rel_error": "" if sim_deepep is None else sim_deepep / measured - 1}


def collective_rows(files: tuple[str, ...] = ("collectives_calibration.csv", "collectives_test.csv"),
                    limit: int | None = None) -> list[dict]:
    """Multi-node collective rows: analytic formula (proxy) and flow engine (simulator)."""
    out = []
    for name in files:
        rows = [(i, r) for i, r in enumerate(load_rows(DATA / name), start=2) if int(r["nodes"] or 1) > 1]
        for line, row in rows[:limit]:
            try:
                case = parse_collective_row(row)
            except ValueError:
                continue
            proxy, _ = simulate_case(case, "analytic")
            sim, algo = simulate_case(case, "flow")
            cause, why = "schedule", (f"{algo}: the flow engine runs NCCL's chunks over channels on the real "
                                      f"links; the closed form charges the bottleneck bandwidth for the whole message")
            if case.concurrent_groups > 1 and abs(sim / proxy - 1) > DIFFER:
                alone, _ = simulate_case(dataclasses.replace(case, concurrent_groups=1), "flow")
                if abs(sim / alone - 1) > abs(alone / proxy - 1):
                    cause = "contention"
                    why = (f"{case.concurrent_groups} concurrent groups share links: x{sim / alone:.2f} over "
                           f"one group alone")
            label = f"{case.collective} {case.nodes}x{case.gpus_per_node} {case.size_bytes / 2**20:g} MiB"
            out.append(_row("collectives", f"{name}:{line}", split_of(row), label, "time_s", case.measured_time_s,
                            proxy, sim, cause, why))
    return out


def _constants(case):
    """DeepEP's constants for the row's kernel version: low-latency rows of the pure-RDMA README
    reach same-node ranks over RDMA too (as :func:`validation.studies.moe.predict` prices them)."""
    return dataclasses.replace(DEFAULT_DEEPEP, ll_nvlink=DEFAULT_DEEPEP.ll_nvlink and case.ll_nvlink)


def _flow_deepep(case, pair_tokens: np.ndarray) -> float:
    """The engine's DeepEP exchange of ``pair_tokens`` copies on the row's GPUs, run as flows on its
    rail-optimized InfiniBand topology (:func:`simcore.moe.deepep_exchange.run_exchange`; seconds)."""
    nodes = max(1, case.ep // case.ranks_per_node)
    gpu = {"h800": "h800", "h200": "h200"}.get(case.gpu, "h100")
    graph = build_topology(f"{gpu}-ib-rail", num_nodes=nodes)
    per = graph.graph["gpus_per_node"]
    ranks = [f"gpu{n * per + i}" for n in range(nodes) for i in range(case.ranks_per_node)]
    env = simpy.Environment()
    network = FlowNetwork(env, graph, seed=_SEED)
    ctx = types.SimpleNamespace(collective_constants=DEFAULT,
                                cluster=types.SimpleNamespace(fabric=Fabric.from_topology(graph),
                                                              gpu=get_gpu(case.gpu)))
    ex = exchange(ctx, graph, ranks, pair_tokens, case.mode, case.tokens, case.top_k, case.token_bytes,
                  c=_constants(case))
    proc = env.process(run_exchange(env, network, ex))
    env.run(until=proc)
    return float(proc.value)


def deepep_rows(path: Path = DATA / "ep_alltoall_deepep.csv", limit: int | None = None) -> list[dict]:
    """DeepEP rows: closed form (proxy) and the engine's DeepEP exchange of a sampled routing, run as
    flows (simulator)."""
    cases, _ = load_cases(path)
    out = []
    for case in cases[:limit]:
        draw = draw_copies(BENCH_ROUTING, BENCH_EXPERTS, case.ep, case.tokens * case.top_k, _SEED, 0,
                           top_k=case.top_k)
        pair = draw.pair_tokens if case.op == "dispatch" else draw.pair_tokens.T
        proxy_s = predict(case)
        skewed_s = float(np.max(pair_times_s(case.mode, pair, case.tokens, case.top_k, case.token_bytes,
                                             case.ranks_per_node, get_gpu(case.gpu), c=_constants(case))))
        sim_s = _flow_deepep(case, pair)
        if case.latency_s is not None:
            metric, measured, proxy, sim, alt = "time_s", case.latency_s, proxy_s, sim_s, skewed_s
        else:  # DeepEP reports bandwidth: bottleneck bytes over time
            b = bottleneck_bytes(case)
            metric, measured = "bandwidth_bytes_per_s", case.bandwidth_bytes_per_s
            proxy, sim, alt = b / proxy_s, b / sim_s, b / skewed_s
        skew, flows = skewed_s / proxy_s - 1, sim_s / skewed_s - 1
        cause = "skew" if abs(skew) > abs(flows) else "flows"
        why = (f"sampled routing's busiest rank x{draw.max_load:.3f} of the mean moves DeepEP's time "
               f"{skew:+.1%}; its kernels' flows on the topology vs DeepEP's per-rank formula {flows:+.1%}")
        label = f"{case.kernel} {case.op} EP{case.ep} {case.tokens} tok {case.gpu}"
        out.append(_row("deepep", f"{path.name}:{case.line}", case.split, label, metric, measured, proxy, sim,
                        cause, why, alt))
    return out


def inference_rows(files: tuple[str, ...] = ("inference_calibration.csv", "inference_test.csv",
                                             "inference_h100_measured.csv"), limit: int | None = None) -> list[dict]:
    """End-to-end rows: proxy and simulator of the same strategy; departures explained by cause."""
    out = []
    for name in files:
        with open(DATA / name, newline="") as fh:
            rows = list(enumerate(csv.DictReader(fh), start=2))
        for line, row in rows[:limit]:
            try:
                case = parse_inference_row(row)
            except (ValueError, KeyError):
                continue
            p = evaluate(case.ctx, case.strategy)
            s = simulate(case.ctx, _graph(case), case.strategy, EngineConfig())
            proxy, sim = _metric(case, p), _metric(case, s)
            split = critical_split(s.split)
            util = max(s.link_utilization.values(), default=0.0)
            cause = dominant_cause(deltas(p.by_category, split)) if s.split else "static"
            why = explain(p.by_category, split, util) if s.split else ""
            label = f"{case.ctx.model.name} tp{case.strategy.tp} pp{case.strategy.pp} ep{case.strategy.ep} " \
                    f"{row.get('scenario')} b{row.get('batch')}"
            if math.isfinite(proxy) and math.isfinite(sim) and proxy > 0 and case.value > 0:
                out.append(_row("inference", f"{name}:{line}", split_of(row), label, row["metric"], case.value, proxy,
                                sim, cause, why))
    return out


def run(out_dir: str | Path, quick: bool = False, report: str | Path | None = None) -> dict:
    """Price every measured row both ways; write ``measured.csv``, ``measured.json`` and the report
    section (into ``report``, default ``out_dir/report.md``); return the summary."""
    limit = 6 if quick else None
    rows = collective_rows(limit=limit) + deepep_rows(limit=limit) + inference_rows(limit=limit)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "measured.csv", list(rows[0]), rows)
    summary = summarize(rows) | {"quick": quick}
    atomic_write_text(out / "measured.json", json.dumps(summary, indent=1))
    write_section(Path(report) if report else out / "report.md", summary, rows)
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 6 rows of every file")
    parser.add_argument("--out", default="outputs/fidelity", help="output directory")
    parser.add_argument("--report", help="report.md to put the section in (default OUT/report.md)")
    args = parser.parse_args(argv)
    summary = run(args.out, args.quick, args.report)
    print(dumps(summary["headline"]))
    return summary


if __name__ == "__main__":
    main()
