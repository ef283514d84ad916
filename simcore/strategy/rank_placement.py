"""Placement: which physical GPU each rank of a strategy runs on, and its communicators.

Ranks are numbered ``((d * pp + p) * ep + e) * tp + i`` (replica ``d``, stage ``p``, attention group
``e``, tensor rank ``i``). The default rule ``pack`` puts rank ``r`` on the ``r``-th GPU of the
topology, so TP groups sit inside a node whenever ``tp`` divides the node; ``spread`` deals ranks
round-robin over nodes (TP groups span nodes), for studies of what placement costs.
"""

from __future__ import annotations

from simcore.strategy.sharding import Strategy

__all__ = ["PLACEMENTS", "Placement"]

PLACEMENTS = ("pack", "spread")


class Placement:
    """Rank -> GPU node name, and the concrete groups of each communicator of a stage."""

    def __init__(self, strategy: Strategy, gpus: list[str], gpus_per_node: int, rule: str = "pack"):
        if rule not in PLACEMENTS:
            raise ValueError(f"sim.placement: {rule!r} is not one of {', '.join(PLACEMENTS)}")
        if strategy.gpus > len(gpus):
            raise ValueError(f"strategy needs {strategy.gpus} GPUs, the topology has {len(gpus)}")
        self.s = strategy
        n = strategy.gpus
        if rule == "pack":
            order = list(range(n))
        else:
            nodes = max(1, len(gpus) // gpus_per_node)
            order = [(r % nodes) * gpus_per_node + r // nodes for r in range(n)]
        self.gpu = [gpus[i] for i in order]

    def rank(self, d: int, p: int, e: int, i: int) -> int:
        s = self.s
        return ((d * s.pp + p) * s.ep + e) * s.tp + i

    def stage_gpus(self, p: int) -> list[str]:
        s = self.s
        return [self.gpu[self.rank(d, p, e, i)] for d in range(s.dp) for e in range(s.ep) for i in range(s.tp)]

    def groups(self, group: str, p: int) -> list[list[str]]:
        """Every concurrent communicator of kind ``group`` (tp | ep | pp) that stage ``p`` runs."""
        s, g = self.s, self.gpu
        if group == "tp":
            return [[g[self.rank(d, p, e, i)] for i in range(s.tp)] for d in range(s.dp) for e in range(s.ep)]
        if group == "ep":
            return [[g[self.rank(d, p, e, i)] for e in range(s.ep)] for d in range(s.dp) for i in range(s.tp)]
        if group == "pp":
            return [[g[self.rank(d, p, e, i)], g[self.rank(d, p + 1, e, i)]]
                    for d in range(s.dp) for e in range(s.ep) for i in range(s.tp)]
        raise ValueError(f"unknown communicator {group!r}")
