"""Speed of the flow-level network (``simcore.network.flownet.FlowNetwork``).

``python -m validation.bench.network`` runs four cases and prints wall and CPU time, events
(rate solves + completion timeouts) and events per second, then one JSON line:

- ``ring_8``: ring all-reduce of 1 GiB on the 8 GPUs of ``hgx-h100`` as 2(n-1) steps, each a
  ``transfer_group`` of n flows of size/n bytes (target <= 50 ms wall);
- ``a2a_64``: all-to-all of 64 MiB per rank among 64 GPUs on 8 nodes of ``h100-ib-rail``,
  n(n-1) flows of size/n bytes started together (target <= 1 s);
- ``hier_1024``: hierarchical all-reduce of 1 GiB on 1024 GPUs / 128 nodes of
  ``h100-ib-rail``: intra-node reduce-scatter ring, inter-node ring all-reduce per rail,
  intra-node all-gather ring (target <= 2 s);
- ``scaling``: wall time against the number of concurrent flows (64 .. 8192) for a
  symmetric shift pattern and for random destinations, with the fitted exponent
  ``wall ~ flows^k``;
- ``nccl_ring_8``, ``nccl_a2a_64``, ``nccl_hier_1024``: the same three collectives through the
  NCCL-style library (:func:`simcore.collectives.flows.run_collective`: derated links, 16 pipelined
  ring channels as chain flows, PXN), same targets;
- ``contention_2x_allgather_ratio``: two 256 MiB ring all-gathers at once on the 8 GPUs of one
  ``hgx-h100`` node over one alone (physics: 2.0 for the bandwidth term; the fixed latency and launch
  terms of the two overlap), and ``contention_2x_allgather_bandwidth_ratio``, the same without them.

The first three drivers are deliberately minimal (raw flows on raw links); the NCCL-style library
lives in ``simcore/collectives/``. Wall times exclude building the topology graph.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Generator

import numpy as np
import simpy

from simcore.collectives import DEFAULT, Fabric
from simcore.collectives.cost import entry_costs
from simcore.collectives.flows import run_collective, simulate_collective
from simcore.files import dumps
from simcore.network.flownet import FlowNetwork
from topologies import build_topology, gpu_nodes

__all__ = ["ring_allreduce", "alltoall", "hierarchical_allreduce", "run_case", "contention_ratio", "main"]

GIB = 2**30
MIB = 2**20


def ring_allreduce(net: FlowNetwork, ranks: list[str], size_bytes: float) -> Generator:
    """SimPy process: 2(n-1) ring steps, each n flows of size/n from rank i to rank i+1."""
    n = len(ranks)
    pairs = [(ranks[i], ranks[(i + 1) % n]) for i in range(n)]
    for _ in range(2 * (n - 1)):
        yield net.transfer_group(pairs, size_bytes / n)


def alltoall(net: FlowNetwork, ranks: list[str], size_bytes: float) -> Generator:
    """SimPy process: every rank sends size/n bytes to every other rank, all at once."""
    n = len(ranks)
    yield net.transfer_group([(a, b) for a in ranks for b in ranks if a != b], size_bytes / n)


def hierarchical_allreduce(net: FlowNetwork, graph, size_bytes: float) -> Generator:
    """SimPy process: intra-node reduce-scatter, inter-node all-reduce per rail, intra-node all-gather.

    Every ring step of a phase runs on all nodes (or all rails) at once as one group.
    """
    nodes, per = graph.graph["num_nodes"], graph.graph["gpus_per_node"]
    gpus = gpu_nodes(graph)
    intra = [(gpus[n * per + i], gpus[n * per + (i + 1) % per]) for n in range(nodes) for i in range(per)]
    inter = [(gpus[n * per + r], gpus[((n + 1) % nodes) * per + r]) for r in range(per) for n in range(nodes)]
    for _ in range(per - 1):  # reduce-scatter inside each node
        yield net.transfer_group(intra, size_bytes / per)
    shard = size_bytes / per
    for _ in range(2 * (nodes - 1)):  # ring all-reduce of each shard along its rail
        yield net.transfer_group(inter, shard / nodes)
    for _ in range(per - 1):  # all-gather inside each node
        yield net.transfer_group(intra, size_bytes / per)


def run_case(graph, process: Callable[[FlowNetwork], Generator], seed: int = 0) -> dict[str, float]:
    """Simulate one driver on a fresh environment; times cover network setup and run.

    ``cpu_s`` (process CPU time) is reported beside ``wall_s`` because wall time on a shared
    machine includes time stolen by other processes.
    """
    start, cpu = time.perf_counter(), time.process_time()
    env = simpy.Environment()
    net = FlowNetwork(env, graph, seed=seed)
    done = env.process(process(net))
    env.run(until=done)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"wall_s": wall, "cpu_s": cpu, "events": net.events_processed,
            "events_per_s": net.events_processed / wall, "sim_time_s": env.now}


def _nccl(collective: str, size_bytes: float, algorithm: str = "auto"):
    """A :func:`run_case` driver running one library collective over every GPU of the graph."""
    def process(net: FlowNetwork) -> Generator:
        yield run_collective(net.env, net, collective, size_bytes, gpu_nodes(net.graph), algorithm)
    return process


def contention_ratio(size_bytes: float = 256 * MIB) -> dict[str, float]:
    """Two ring all-gathers of ``size_bytes`` at once on the 8 GPUs of one node, over one alone: total
    time, and bandwidth time (total less NCCL's latency and the launch overhead, which overlap)."""
    hgx = build_topology("hgx-h100")
    ranks = gpu_nodes(hgx)
    one = simulate_collective(hgx, "all_gather", size_bytes, ranks, "ring")
    two = simulate_collective(hgx, "all_gather", size_bytes, ranks, "ring", concurrent_groups=[ranks])
    ((_, _, cost),) = entry_costs("all_gather", size_bytes, 8, 8, Fabric.from_topology(hgx), "ring", "simple",
                                  DEFAULT)
    fixed = float(cost.latency_s + cost.extra_latency_s)
    return {"one_s": one, "two_s": two, "ratio": two / one, "bandwidth_ratio": (two - fixed) / (one - fixed)}


def _shift_pairs(gpus: list[str], num_flows: int) -> list[tuple[str, str]]:
    """Inter-node same-rail shifts: flow i goes from gpu i to gpu i + 8 * (1 + i // N)."""
    n = len(gpus)
    return [(gpus[i % n], gpus[(i % n + 8 * (1 + i // n)) % n]) for i in range(num_flows)]


def _random_pairs(gpus: list[str], num_flows: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < num_flows:
        a, b = rng.sample(gpus, 2)
        pairs.append((a, b))
    return pairs


def _scaling(graph, counts: list[int]) -> dict[str, object]:
    gpus = gpu_nodes(graph)
    rows = {}
    for pattern, make in (("shift", _shift_pairs), ("random", _random_pairs)):
        walls = []
        for count in counts:
            pairs = make(gpus, count)

            def proc(net, pairs=pairs):
                yield net.transfer_group(pairs, MIB)
            result = run_case(graph, proc)
            walls.append(result["wall_s"])
            rows[f"{pattern}_{count}"] = result
        slope = float(np.polyfit(np.log(counts), np.log(walls), 1)[0])
        rows[f"{pattern}_exponent"] = slope
    return rows


def _line(name: str, r: dict[str, float]) -> str:
    return (f"{name:<14} wall {r['wall_s'] * 1e3:8.1f} ms  cpu {r['cpu_s'] * 1e3:8.1f} ms  "
            f"events {r['events']:5d}  {r['events_per_s']:7.0f} ev/s  sim {r['sim_time_s'] * 1e3:7.3f} ms")


def main() -> dict[str, object]:
    """Run every case, print a table, end with one JSON line of the figures."""
    figures: dict[str, object] = {}
    hgx = build_topology("hgx-h100")
    figures["ring_8"] = run_case(hgx, lambda net: ring_allreduce(net, gpu_nodes(hgx), GIB))
    print(_line("ring_8", figures["ring_8"]), "(target <= 50 ms)")
    rail8 = build_topology("h100-ib-rail", num_nodes=8)
    figures["a2a_64"] = run_case(rail8, lambda net: alltoall(net, gpu_nodes(rail8), 64 * MIB))
    print(_line("a2a_64", figures["a2a_64"]), "(target <= 1 s)")
    t0 = time.perf_counter()
    rail128 = build_topology("h100-ib-rail", num_nodes=128)
    print(f"build h100-ib-rail 128 nodes: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    figures["hier_1024"] = run_case(rail128, lambda net: hierarchical_allreduce(net, rail128, GIB))
    print(_line("hier_1024", figures["hier_1024"]), "(target <= 2 s)")
    counts = [64 * 2**k for k in range(8)]
    scaling = _scaling(rail128, counts)
    print(f"{'flows':>6} {'shift ms':>10} {'ev':>5} {'random ms':>10} {'ev':>5}")
    for count in counts:
        s, r = scaling[f"shift_{count}"], scaling[f"random_{count}"]
        print(f"{count:>6} {s['wall_s'] * 1e3:10.1f} {s['events']:>5} "
              f"{r['wall_s'] * 1e3:10.1f} {r['events']:>5}")
    print(f"fitted exponent wall ~ flows^k: shift k = {scaling['shift_exponent']:.2f}, "
          f"random k = {scaling['random_exponent']:.2f}")
    figures["scaling"] = scaling
    for name, graph, case, target in (("nccl_ring_8", hgx, _nccl("all_reduce", GIB, "ring"), "50 ms"),
                                      ("nccl_a2a_64", rail8, _nccl("all_to_all", 64 * MIB), "1 s"),
                                      ("nccl_hier_1024", rail128, _nccl("all_reduce", GIB, "hierarchical"), "2 s")):
        figures[name] = run_case(graph, case)
        print(_line(name, figures[name]), f"(target <= {target})")
    contention = contention_ratio()
    print(f"two 256 MiB ring all-gathers on one node: {contention['two_s'] * 1e3:.3f} ms vs one "
          f"{contention['one_s'] * 1e3:.3f} ms: x{contention['ratio']:.3f} (bandwidth term "
          f"x{contention['bandwidth_ratio']:.3f}; physics: 2)")
    figures["contention_2x_allgather_ratio"] = contention["ratio"]
    figures["contention_2x_allgather_bandwidth_ratio"] = contention["bandwidth_ratio"]
    print(dumps(_rounded(figures), separators=(",", ":")))
    return figures


def _rounded(value):
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    return value


if __name__ == "__main__":
    main()
