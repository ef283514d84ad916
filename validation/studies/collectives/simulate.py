"""The collectives study's prediction: each :class:`.rows.Case` priced by the analytic model
(:func:`simcore.collectives.collective_time_s`) or the flow simulator
(:func:`simcore.collectives.flows.simulate_collective`), charged its harness's per-call overhead.
"""

from __future__ import annotations

from pathlib import Path

from simcore.collectives import DEFAULT, Fabric, NcclConstants, collective_time_s, select
from simcore.collectives.flows import simulate_collective
from topologies import build_topology
from validation.studies.collectives.harness import (
    HARNESS_OVERHEAD_S,
    PER_DEVICE_LAUNCH_S,
    check_harness,
    overhead_s,
)
from validation.studies.collectives.rows import COLUMNS, Case, busbw_factor, load_rows, parse_row
from validation.studies.collectives.summary import band_of
from validation.studies.common.split import split_of

__all__ = ["OUTPUT_COLUMNS", "TOPOLOGY_OF_FABRIC", "simulate_case", "evaluate"]

OUTPUT_COLUMNS = ("harness", "sim_time_us", "sim_busbw_GBps", "sim_algorithm", "rel_error", "skipped_reason")
#: The topology preset a multi-node row runs on, by fabric (H200 rows share H100's NVLink4/NVSwitch and
#: 400 Gb/s-per-GPU NICs, so the H100 presets stand for them).
TOPOLOGY_OF_FABRIC = {"ib": "h100-ib-rail", "efa": "h100-efa", "roce": "h100-roce"}


def _topology(nodes: int, fabric: str = "ib"):
    if nodes == 1:
        return build_topology("hgx-h100")
    return build_topology(TOPOLOGY_OF_FABRIC[fabric], num_nodes=nodes)


def simulate_case(case: Case, engine: str = "analytic", constants: NcclConstants = DEFAULT,
                  overheads: dict[str, float] = HARNESS_OVERHEAD_S,
                  per_device_s: float = PER_DEVICE_LAUNCH_S) -> tuple[float, str]:
    """(simulated time in seconds, algorithm used) for one case.

    The case's harness overhead (:func:`.harness.overhead_s`) replaces ``constants.launch_overhead_s``.
    The flow engine places ``concurrent_groups`` groups side by side (iota over the node's GPUs) and
    runs them together; the analytic model has no contention, so there they change nothing.
    """
    extra = overhead_s(case.harness, case.devices_per_process, overheads, per_device_s)
    constants = constants.with_overrides(launch_overhead_s=extra)
    graph = _topology(case.nodes, case.fabric)
    fabric = Fabric.from_topology(graph)
    args = (case.collective, case.size_bytes, case.n_ranks, case.gpus_per_node, fabric)
    algo = case.algorithm
    if algo == "auto":
        algo = str(select(*args, constants=constants)[0])
    if engine == "analytic":
        return float(collective_time_s(*args, algorithm=algo, constants=constants)), algo

    per = case.gpus_per_node
    groups = [[f"gpu{node * graph.graph['gpus_per_node'] + g * per + i}" for node in range(case.nodes)
               for i in range(per)] for g in range(case.concurrent_groups)]
    return simulate_collective(graph, case.collective, case.size_bytes, groups[0], algorithm=algo,
                               concurrent_groups=groups[1:] or None, constants=constants), algo


def _simulate_all(rows: list[dict[str, str]], engine: str, constants: NcclConstants,
                  harness: str = "auto") -> list[dict]:
    records = []
    for row in rows:
        record = {**{c: row.get(c, "") for c in COLUMNS}, **{c: "" for c in OUTPUT_COLUMNS}}
        record["split"] = split_of(row)
        try:
            case = parse_row(row, harness)
            record["fabric"] = case.fabric
            sim_s, algo = simulate_case(case, engine, constants)
        except ValueError as exc:
            record["skipped_reason"] = str(exc).replace("\n", " ")
            records.append(record)
            continue
        err = (sim_s - case.measured_time_s) / case.measured_time_s
        busbw = case.size_bytes / sim_s * busbw_factor(case.collective, case.n_ranks) / 1e9
        record.update(harness=case.harness, sim_time_us=f"{sim_s * 1e6:.3f}", sim_busbw_GBps=f"{busbw:.3f}", sim_algorithm=algo,
                      rel_error=f"{err:.4f}", _case=case, _err=err, _sim_s=sim_s,
                      _band=band_of(case.size_bytes))
        records.append(record)
    return records


def evaluate(data_path: str | Path, engine: str = "analytic", constants: NcclConstants = DEFAULT,
             harness: str = "auto") -> list[dict]:
    """One record per CSV row: its columns, the simulated figures, private ``_case``/``_err``/``_sim_s``.

    ``harness``: ``auto`` reads each row's harness from its text; a name applies that one to every row."""
    if engine not in ("analytic", "flow"):
        raise ValueError(f"unknown engine {engine!r}; choose one of: analytic, flow")
    return _simulate_all(load_rows(data_path), engine, constants, check_harness(harness))
