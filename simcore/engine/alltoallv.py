"""All-to-all-v as flows: every pair of an EP communicator moves its own byte count.

NCCL's direct all-to-all (:mod:`simcore.collectives.flows`) sends one chunk to every peer at once,
each flow capped at the per-peer share of the GPU's NVLink or NIC bandwidth (``f / (p - 1)`` inside
an NVLink domain, ``f / (n - p)`` across), with a cross-domain pair going over NVLink to the GPU on
the destination's rail first (PXN). The -v variant keeps that shape and those caps but gives every
pair its own size, so a hot receiver's flows take longer and the collective ends with the slowest
pair: with equal sizes it is the direct all-to-all, to the same latency and bandwidth terms.
"""

from __future__ import annotations

import numpy as np
import simpy

from ..collectives.cost import make_shape
from ..collectives.flows import resolve
from ..collectives.formulas import PROTO_INDEX, p2p_bandwidths
from .pricing import group_shape

__all__ = ["run_alltoallv", "pxn_relay"]


def pxn_relay(graph, src: str, dst: str) -> str | None:
    """The GPU in ``src``'s node on ``dst``'s rail when the pair crosses NVLink domains and rails."""
    a, b = graph.nodes[src], graph.nodes[dst]
    if a.get("domain", a.get("node")) == b.get("domain", b.get("node")) or a.get("local") == b.get("local"):
        return None
    per = graph.graph.get("gpus_per_node")
    if per is None or a.get("node") is None or b.get("local") is None:
        return None
    peer = f"gpu{int(a['node']) * int(per) + int(b['local'])}"
    return peer if peer in graph else None


def _entry(ctx, ranks: list[str], graph, size_bytes: float):
    from ..collectives import DEFAULT

    constants = ctx.collective_constants or DEFAULT
    n, per = group_shape(graph, ranks)
    fabric = ctx.cluster.fabric
    shape = make_shape(size_bytes, n, per, fabric)
    _, proto, cost = resolve("all_to_all", shape, fabric, "direct", "auto", constants)
    f_nvl, f_nic = (float(x) for x in p2p_bandwidths(shape, fabric, PROTO_INDEX[proto], constants))
    return n, per, float(cost.latency_s + cost.extra_latency_s), f_nvl, f_nic


def run_alltoallv(env: simpy.Environment, network, ctx, ranks: list[str], pair_bytes: np.ndarray):
    """Process: ``pair_bytes[a, b]`` bytes from ``ranks[a]`` to ``ranks[b]``; value: elapsed seconds.
    Latency and per-flow caps are those of the direct all-to-all whose chunk is the largest pair."""
    start = env.now
    graph = network.graph
    n = len(ranks)
    biggest = float(pair_bytes.max()) if pair_bytes.size else 0.0
    if n <= 1 or biggest <= 0:
        return 0.0
    _, per, latency, f_nvl, f_nic = _entry(ctx, ranks, graph, biggest * n)
    cap_nvl = f_nvl / max(per - 1, 1)
    cap_nic = f_nic / max(n - per, 1)
    transfers = []
    max_path = 0.0
    plan = []
    for a, src in enumerate(ranks):
        for b, dst in enumerate(ranks):
            size = float(pair_bytes[a, b])
            if a == b or size <= 0:
                continue
            relay = pxn_relay(graph, src, dst)
            intra = relay is None and _same_domain(graph, src, dst)
            hops = [(src, dst)] if relay is None else [(src, relay), (relay, dst)]
            for u, v in hops:
                max_path = max(max_path, network.path_latency(u, v))
                plan.append((u, v, size, cap_nvl if intra else cap_nic))
    wait = max(latency - max_path, 0.0)
    if wait > 0:
        yield env.timeout(wait)
    for u, v, size, cap in plan:
        transfers.append(network.transfer(u, v, size, rate_cap_bytes_per_s=cap, tag=("all_to_all_v",)))
    yield env.all_of(transfers)
    return env.now - start


def _same_domain(graph, a: str, b: str) -> bool:
    da, db = graph.nodes[a], graph.nodes[b]
    return da.get("domain", da.get("node")) == db.get("domain", db.get("node"))
