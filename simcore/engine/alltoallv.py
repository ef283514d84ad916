"""All-to-all-v as flows: every pair of an EP communicator moves its own byte count.

NCCL's direct all-to-all (:mod:`simcore.collectives.flows`) sends one chunk to every peer at once,
each flow capped at the per-peer share of the GPU's NVLink or NIC bandwidth (``f / (p - 1)`` inside
an NVLink domain, ``f / (n - p)`` across), a cross-domain pair going over NVLink to the GPU on the
destination's rail first (PXN, one pipelined chain). The -v variant is that same plan, latency,
protocol (wire bytes), fill and link derating, built and run by the library's own compiler, with every
pair at its own size: a pair of ``s`` bytes is a set of duration ``s / cap``, so on an idle fabric
the collective ends with its largest pair, and with equal sizes it is the direct all-to-all exactly.
"""

from __future__ import annotations

import numpy as np
import simpy

from simcore.collectives import DEFAULT
from simcore.collectives.cost import make_shape
from simcore.collectives.flows import _compile, _execute, _fill_ratio, resolve
from simcore.collectives.formulas import PROTO_INDEX, p2p_bandwidths
from simcore.collectives.patterns import Plan, domains, pxn_relay
from simcore.collectives.pipeline import nccl_link_efficiency

__all__ = ["run_alltoallv", "pxn_relay"]


def _phases(ctx, graph, ranks: list[str], pair_bytes: np.ndarray):
    constants = ctx.collective_constants or DEFAULT
    fabric = ctx.cluster.fabric
    plan = Plan(graph, domains(graph, ranks), ranks)
    shape = make_shape(float(pair_bytes.max()) * plan.n, plan.n, plan.p, fabric)
    _, proto, cost = resolve("all_to_all", shape, fabric, "direct", "auto", constants)
    f_nvl, f_nic = (float(x) for x in p2p_bandwidths(shape, fabric, PROTO_INDEX[proto], constants))
    cap_nvl, cap_nic = f_nvl / max(plan.p - 1, 1), f_nic / max(plan.n - plan.p, 1)
    by_kind: dict[tuple[float, bool], list] = {}  # equal pairs share one set (one network batch)
    for a, src in enumerate(ranks):
        for b, dst in enumerate(ranks):
            size = float(pair_bytes[a, b])
            if a != b and size > 0:
                by_kind.setdefault((size, plan.same_domain(src, dst)), []).append(plan.p2p(src, dst, size))
    sets = [(flows, size / (cap_nvl if intra else cap_nic)) for (size, intra), flows in by_kind.items()]
    return [(float(cost.latency_s + cost.extra_latency_s), sets, _fill_ratio(cost))], proto, constants


def run_alltoallv(env: simpy.Environment, network, ctx, ranks: list[str], pair_bytes: np.ndarray):
    """Process: ``pair_bytes[a, b]`` bytes from ``ranks[a]`` to ``ranks[b]``; value: elapsed seconds."""
    if len(ranks) <= 1 or not pair_bytes.size or float(pair_bytes.max()) <= 0:
        return 0.0
    graph = network.graph
    phases, proto, constants = _phases(ctx, graph, ranks, pair_bytes)
    if network.link_efficiency is None:  # as run_collective: the idle-fabric equality needs it
        network.set_link_efficiency(nccl_link_efficiency(graph, constants, ctx.cluster.fabric))
    return (yield from _execute(env, network, _compile(network, phases, proto), ("all_to_all", "direct-v", proto)))
