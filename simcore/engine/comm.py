"""How a communication op takes time: on an idle fabric (the analytic cost), or as flows that
share the network with everything else in flight (contention)."""

from __future__ import annotations

import simpy

from ..collectives.flows import run_collective
from .placement import Placement
from .program import Op

__all__ = ["AnalyticComm", "FlowComm"]


class AnalyticComm:
    """Contention off: every collective takes its idle-fabric cost, exactly what the proxy charges."""

    def run(self, env: simpy.Environment, stage: int, op: Op):
        if op.duration_s > 0:
            yield env.timeout(op.duration_s)


class FlowComm:
    """Contention on: the op runs on every concurrent communicator of its stage (all TP groups, all
    EP groups, every replica) as NCCL-shaped flows on one shared :class:`~simcore.network.FlowNetwork`.
    On an idle fabric a collective takes its analytic cost (``tests/test_collectives.py``); sharing
    links with other collectives slows it down."""

    def __init__(self, network, placement: Placement, constants=None, fabric=None):
        self.network, self.placement = network, placement
        self.kwargs = {} if constants is None else {"constants": constants}
        self.fabric = fabric
        self._groups: dict[tuple[str, int], list[list[str]]] = {}

    def groups(self, group: str, stage: int) -> list[list[str]]:
        key = (group, stage)
        if key not in self._groups:
            self._groups[key] = self.placement.groups(group, stage)
        return self._groups[key]

    def run(self, env: simpy.Environment, stage: int, op: Op):
        if op.size_bytes <= 0:
            return
        procs = [run_collective(env, self.network, op.collective, op.size_bytes, ranks, fabric=self.fabric,
                                **self.kwargs)
                 for ranks in self.groups(op.group, stage)]
        yield env.all_of(procs)
