"""Routing study: static ECMP against adaptive routing on a two-tier fat tree, at 1:1 and 2:1.

``python -m validation.studies.collectives.network_routing`` builds ``ib_fattree`` (8 HGX H100 nodes, 2 per leaf: 4 leaves,
4 spines; leaf uplinks = downlinks / oversubscription) and runs three NCCL-style collectives through
:func:`simcore.collectives.flows.run_collective` on a :class:`simcore.network.flownet.FlowNetwork` with
derated links, under

* ``ecmp``: every flow (each ring channel, each queue pair) hashed onto a spine by a seeded CRC32 of
  (seed, src, dst, channel, hop), as switches hash 5-tuples; seeds 0-4, mean and worst;
* ``adaptive``: each flow takes the least-loaded uplink (fewest unfinished flows per byte/s) when it
  starts, a per-flow rendering of InfiniBand adaptive routing.

Workloads: ``dp_allreduce``, the 8 rail groups (GPU j of every node, as data-parallel replicas of a
TP8 model are) each ring-all-reducing 256 MiB at once; ``a2a``, an all-to-all of 64 MiB per GPU over
all 64 GPUs (PXN); ``ring_allgather``, one 1 GiB ring all-gather over all 64 GPUs. For each: the
collective time, the busiest leaf -> spine uplink's mean utilization over the run (bytes over
capacity x time) and the uplink imbalance (busiest over mean bytes). Ends with one JSON line.
"""

from __future__ import annotations

import statistics
import time

import simpy

from simcore.collectives import DEFAULT, Fabric
from simcore.collectives.flows import run_collective
from simcore.collectives.pipeline import nccl_link_efficiency
from simcore.files import dumps
from simcore.network.flownet import FlowNetwork
from topologies import gpu_nodes, ib_fattree

__all__ = ["WORKLOADS", "run_workload", "study", "main"]

MIB = 2**20
NUM_NODES, NODES_PER_LEAF = 8, 2
SEEDS = (0, 1, 2, 3, 4)


def _dp_allreduce(gpus: list[str], per_node: int) -> list[tuple[str, float, list[str], str]]:
    return [("all_reduce", 256 * MIB, gpus[j::per_node], "ring") for j in range(per_node)]


def _a2a(gpus: list[str], per_node: int) -> list[tuple[str, float, list[str], str]]:
    return [("all_to_all", 64 * MIB, gpus, "direct")]


def _ring_allgather(gpus: list[str], per_node: int) -> list[tuple[str, float, list[str], str]]:
    return [("all_gather", 1024 * MIB, gpus, "ring")]


#: name -> the collectives started together: (collective, bytes, ranks, algorithm)
WORKLOADS = {"dp_allreduce": _dp_allreduce, "a2a": _a2a, "ring_allgather": _ring_allgather}


def run_workload(graph, workload: str, routing: str, seed: int = 0) -> dict[str, float]:
    """Time (s) of one workload, its busiest uplink's utilization and the uplinks' imbalance."""
    env = simpy.Environment()
    efficiency = nccl_link_efficiency(graph, DEFAULT, Fabric.from_topology(graph))
    net = FlowNetwork(env, graph, seed=seed, link_efficiency=efficiency, routing=routing)
    calls = WORKLOADS[workload](gpu_nodes(graph), int(graph.graph["gpus_per_node"]))
    procs = [run_collective(env, net, coll, size, ranks, algo, "simple") for coll, size, ranks, algo in calls]
    env.run(until=env.all_of(procs))
    elapsed = max(p.value for p in procs)
    kinds = dict(graph.nodes(data="kind"))
    capacity, carried = net.capacity, net.link_bytes
    uplinks = [link for link in capacity if kinds[link[0]] == "leaf" and kinds[link[1]] == "spine"]
    loads = [carried.get(link, 0.0) for link in uplinks]
    busiest = max(range(len(uplinks)), key=loads.__getitem__)
    mean = statistics.fmean(loads)
    return {"time_s": elapsed, "max_uplink_util": loads[busiest] / (capacity[uplinks[busiest]] * elapsed),
            "imbalance": loads[busiest] / mean if mean > 0 else 1.0}


def study(oversubscriptions: tuple[float, ...] = (1.0, 2.0)) -> list[dict[str, object]]:
    """One row per (oversubscription, workload): ECMP over :data:`SEEDS` (mean, worst) and adaptive."""
    rows = []
    for ratio in oversubscriptions:
        graph = ib_fattree(NUM_NODES, oversubscription=ratio, nodes_per_leaf=NODES_PER_LEAF)
        for workload in WORKLOADS:
            ecmp = [run_workload(graph, workload, "ecmp", seed) for seed in SEEDS]
            adaptive = run_workload(graph, workload, "adaptive")
            times = [r["time_s"] for r in ecmp]
            rows.append({"oversubscription": ratio, "workload": workload,
                         "ecmp_time_ms": statistics.fmean(times) * 1e3, "ecmp_worst_ms": max(times) * 1e3,
                         "adaptive_time_ms": adaptive["time_s"] * 1e3,
                         "speedup": statistics.fmean(times) / adaptive["time_s"],
                         "ecmp_max_util": statistics.fmean(r["max_uplink_util"] for r in ecmp),
                         "adaptive_max_util": adaptive["max_uplink_util"],
                         "ecmp_imbalance": statistics.fmean(r["imbalance"] for r in ecmp),
                         "adaptive_imbalance": adaptive["imbalance"]})
    return rows


def main() -> list[dict[str, object]]:
    """Print the table and end with one JSON line of the rows."""
    start = time.perf_counter()
    rows = study()
    print(f"fat tree: {NUM_NODES} HGX H100 nodes, {NODES_PER_LEAF} per leaf (4 leaves, 4 spines); "
          f"ECMP over seeds {SEEDS[0]}-{SEEDS[-1]}")
    print(f"{'over':>4} {'workload':<15} {'ECMP ms':>9} {'worst':>9} {'adaptive':>9} {'gain':>6} "
          f"{'util E/A':>11} {'imbalance E/A':>14}")
    for r in rows:
        print(f"{r['oversubscription']:>4.0f} {r['workload']:<15} {r['ecmp_time_ms']:9.3f} {r['ecmp_worst_ms']:9.3f} "
              f"{r['adaptive_time_ms']:9.3f} {r['speedup']:6.3f} "
              f"{r['ecmp_max_util']:5.2f}/{r['adaptive_max_util']:<5.2f} "
              f"{r['ecmp_imbalance']:7.2f}/{r['adaptive_imbalance']:<6.2f}")
    print(f"wall {time.perf_counter() - start:.1f} s")
    print(dumps([{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
                     separators=(",", ":")))
    return rows


if __name__ == "__main__":
    main()
