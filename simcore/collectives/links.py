"""Which links a communicator's flows may use on a topology graph (what decides whether two
communicators can contend, in the engine and in the serving simulator)."""

from __future__ import annotations

from simcore.collectives.patterns import pxn_relay

__all__ = ["flow_links"]


def flow_links(graph, network, ranks: list[str], direct: bool = False) -> set:
    """Every link a flow among ``ranks`` may use (a superset of the real flows): each pair's route
    within a domain or along one rail, else the NVLink-then-rail detour NCCL's PXN takes between rails;
    ``direct``: every pair's own route too (DeepEP's low-latency kernels write straight across rails,
    :mod:`simcore.moe.deepep_exchange`)."""
    links: set = set()
    for a in ranks:
        for b in ranks:
            if a == b:
                continue
            if direct:
                links.update(network.path(a, b))
            peer = pxn_relay(graph, a, b)
            if peer is None or peer in (a, b):
                links.update(network.path(a, b))
            else:
                links.update(network.path(a, peer))
                links.update(network.path(peer, b))
    return links
