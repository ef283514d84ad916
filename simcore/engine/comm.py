"""How a communication op takes time: on an idle fabric (the analytic cost), or as flows that
share the network with everything else in flight (contention). :class:`FlowComm` also says how many
SMs each collective's kernel holds (one per NCCL channel), for the executor's SM sharing."""

from __future__ import annotations

import simpy

from simcore.collectives.flows import collective_channels, compile_collective, run_compiled
from simcore.engine.contention import flow_links
from simcore.engine.program import Op
from simcore.hardware.gpus import get_gpu
from simcore.moe.deepep_exchange import run_exchange
from simcore.strategy.rank_placement import Placement

__all__ = ["AnalyticComm", "FlowComm"]


def _disjoint(link_sets: list[set]) -> bool:
    seen: set = set()
    for links in link_sets:
        if seen & links:
            return False
        seen |= links
    return True


class AnalyticComm:
    """Contention off: every collective takes its idle-fabric cost, exactly what the proxy charges."""

    def run(self, env: simpy.Environment, stage: int, op: Op):
        if op.duration_s > 0:
            yield env.timeout(op.duration_s)


class FlowComm:
    """Contention on: the op runs on every concurrent communicator of its stage (all TP groups, all
    EP groups, every replica) as NCCL-shaped flows on one shared :class:`~simcore.network.flownet.FlowNetwork`.
    On an idle fabric a collective takes its analytic cost (``tests/test_collectives.py``); sharing
    links with other collectives slows it down. ``exchanges``
    (:class:`~simcore.moe.deepep_exchange.FoldedExchanges`) runs the MoE exchanges the lowering priced as
    DeepEP's kernels as DeepEP's traffic (their pairs may also take their own routes: ``direct_kinds``)."""

    def __init__(self, network, placement: Placement, constants=None, fabric=None, representative: bool = True,
                 exchanges=None, direct_kinds: frozenset = frozenset()):
        self.network, self.placement = network, placement
        self.kwargs = {} if constants is None else {"constants": constants}
        self.constants, self.fabric = constants, fabric
        self.representative = representative
        self.exchanges, self.direct_kinds = exchanges, frozenset(direct_kinds)
        self._groups: dict[tuple[str, int], list[list[str]]] = {}
        #: SMs per GPU (H100 SXM: 132), of which a running collective holds :meth:`kernel_sms`
        self.num_sms = get_gpu(network.graph.graph["gpu"]).num_sms

    def kernel_sms(self, stage: int, op: Op) -> int:
        """SMs the op's NCCL kernel holds on each GPU of the stage while it runs: one per channel
        (:func:`~simcore.collectives.flows.collective_channels`), 0 for an op that moves nothing."""
        if op.size_bytes <= 0:
            return 0
        ex = self._exchange(op, stage)
        if ex is not None:  # DeepEP's kernels hold their own SMs
            return ex.sms
        key = ("sms", stage, op.group, op.collective, op.size_bytes)
        if key not in self._groups:  # memoized: asked at every collective start
            ranks = self.groups(op.group, stage)[0]
            self._groups[key] = collective_channels(self.network, op.collective, op.size_bytes, ranks,
                                                    fabric=self.fabric, **self.kwargs)
        return self._groups[key]

    def groups(self, group: str, stage: int) -> list[list[str]]:
        """The communicators to put on the network. Identical concurrent groups whose traffic can
        never share a link are represented by the first one alone (exact by symmetry); groups that
        may share links all run, so their contention is modelled explicitly."""
        key = (group, stage)
        if key not in self._groups:
            groups = self.placement.groups(group, stage)
            if self.representative and len(groups) > 1 and _disjoint([self._links(g, group) for g in groups]):
                groups = groups[:1]
            self._groups[key] = groups
        return self._groups[key]

    def _links(self, ranks: list[str], group: str = "") -> set:
        """Every link any flow among ``ranks`` may use (:func:`simcore.collectives.links.flow_links`)."""
        return flow_links(self.network.graph, self.network, ranks, group in self.direct_kinds)

    def _exchange(self, op: Op, stage: int):
        if self.exchanges is None or op.group != "ep":
            return None
        return self.exchanges.get(op, self.groups(op.group, stage)[0])

    def link_set(self, group: str, stage: int) -> set:
        key = ("links", group, stage)
        if key not in self._groups:
            links: set = set()
            for ranks in self.groups(group, stage):
                links |= self._links(ranks, group)
            self._groups[key] = links
        return self._groups[key]

    def contended(self, group: str, stage: int) -> bool:
        """Whether this stage's ``group`` collectives may share a link with other communication:
        with each other (concurrent communicators that :meth:`groups` could not reduce to one) or
        with any other stage's. A stage's own ops never overlap each other (one communication
        stream per stage), so an op that shares no link runs on an idle fabric and takes exactly
        its analytic cost: it skips the flow solver."""
        key = ("contended", group, stage)
        if key not in self._groups:
            mine = self.link_set(group, stage)
            pp = self.placement.s.pp
            others = [(g, q) for q in range(pp) if q != stage for g in ("tp", "ep", "pp")
                      if not (g == "pp" and q == pp - 1)]
            self._groups[key] = (len(self.groups(group, stage)) > 1
                                 or any(mine & self.link_set(g, q) for g, q in others))
        return self._groups[key]

    def run(self, env: simpy.Environment, stage: int, op: Op):
        if op.size_bytes <= 0:
            return
        if not self.contended(op.group, stage):
            if op.duration_s > 0:
                yield env.timeout(op.duration_s)
            return
        if self._exchange(op, stage) is not None:  # DeepEP's traffic on every communicator of the stage
            procs = [env.process(run_exchange(env, self.network, self.exchanges.get(op, ranks), self.constants,
                                              self.fabric))
                     for ranks in self.groups(op.group, stage)]
            yield env.all_of(procs)
            return
        yield env.all_of([run_compiled(env, self.network, c) for c in self._compiled(op, stage)])

    def _compiled(self, op: Op, stage: int) -> list[tuple]:
        """What :func:`~simcore.collectives.flows.run_collective` runs on each communicator, kept per
        (group, stage, collective, size): looking it up again re-hashes the constants and fabric."""
        key = ("compiled", op.group, stage, op.collective, op.size_bytes)
        if key not in self._groups:
            self._groups[key] = [compile_collective(self.network, op.collective, op.size_bytes, ranks,
                                                    fabric=self.fabric, **self.kwargs)
                                 for ranks in self.groups(op.group, stage)]
        return self._groups[key]
