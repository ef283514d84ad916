"""The executor of the per-GPU engine: :class:`~simcore.engine.executor.Executor` over lanes
(:mod:`simcore.engine.lanes`), with collectives through :class:`~simcore.engine.pergpu.LaneComm`."""

from __future__ import annotations

import simpy

from simcore.engine.executor import Executor, _plan, _segments

__all__ = ["LaneExecutor"]


class LaneExecutor(Executor):
    """:class:`~simcore.engine.executor.Executor` over lanes: ``programs[step][lane]`` (a decode step
    may route differently), comm ops through :class:`LaneComm`'s rendezvous, and one pipeline chain
    per lane key (a lane's microbatch enters stage ``p + 1`` on the lane of the same key)."""

    def __init__(self, env: simpy.Environment, lanes, programs, comm, overlap: bool):
        super().__init__(env, [], comm, overlap)
        self.lanes = lanes
        for _ in lanes:
            if overlap:
                self.streams.append({"compute": simpy.PreemptiveResource(env, capacity=1),
                                     "comm": simpy.PriorityResource(env, capacity=1)})
            else:
                self.streams.append({"stage": simpy.Resource(env, capacity=1)})
        cache: dict[int, list] = {}
        self.step_plans = []
        for step_programs in programs:
            row = []
            for prog in step_programs:
                if id(prog) not in cache:
                    cache[id(prog)] = _segments(_plan(prog.ops, overlap))
                row.append(cache[id(prog)])
            self.step_plans.append(row)
        self.programs = programs[0]
        self.plans = self.step_plans[0]
        comm.executor = self
        # LaneComm holds the SMs from a collective's launch to its end (not while queued); compute
        # still runs at the SM fraction left (the executor checks this attribute for that)
        self._kernel_sms = comm.kernel_sms_of if self._num_sms > 0 else None

    def _run_items(self, lane: int, items, microbatch: int, step: int):
        """As :meth:`Executor._run_items`, but a collective does not take the lane's communication
        stream while it waits for its other members (:meth:`LaneComm._dispatch` does, all at once)."""
        branch = None
        for kind, item in items:
            if kind == "seg":
                yield from self._compute(lane, item, microbatch, step)
            elif kind == "op":
                yield from self._comm(lane, item, microbatch, step)
            elif kind == "fork":
                branch = self.env.process(self._run_items(lane, item, microbatch, step))
            elif branch is not None:
                yield branch
                branch = None

    def _comm(self, stage: int, op, microbatch: int, step: int):
        """The op on the communication stream from its launch (not its arrival) to its end."""
        arrived = self.env.now
        launched = yield from self.comm.run(self.env, stage, op, microbatch, step)
        self._log(stage, "comm", op, microbatch, step, arrived if launched is None else launched, self.env.now)

    def _pass(self, lane: int, microbatch: int, step: int, ready, plan):
        yield ready
        if self.overlap:
            yield from self._run_items(lane, plan, microbatch, step)
        else:
            with self.streams[lane]["stage"].request() as req:
                yield req
                yield from self._run_items(lane, plan, microbatch, step)
        return self.env.now

    def run_pipeline(self, microbatches: int, steps: int) -> list[list[float]]:
        """As :meth:`Executor.run_pipeline`, one chain of lanes per lane key; finish times are the
        latest over the chains."""
        env = self.env
        chains: dict[tuple, list[int]] = {}
        for lane in self.lanes:
            chains.setdefault(lane.key, []).append(lane.index)
        finish = [[0.0] * microbatches for _ in range(steps)]
        ready = {key: [env.event().succeed() for _ in range(microbatches)] for key in chains}
        procs = []
        for step in range(steps):
            plans = self.step_plans[min(step, len(self.step_plans) - 1)]
            for j in range(microbatches):
                for key, chain in chains.items():
                    event = ready[key][j]
                    for lane in chain:
                        event = env.process(self._pass(lane, j, step, event, plans[lane]))
                    procs.append((step, j, event))
                    ready[key][j] = event
        env.run(until=env.all_of([e for _, _, e in procs]))
        for step, j, event in procs:
            finish[step][j] = max(finish[step][j], event.value)
        return finish
