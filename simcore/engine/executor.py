"""Runs stage programs on SimPy: streams, microbatches, the pipeline schedule.

Each pipeline stage has a compute stream and a communication stream (one stream for both when
overlap is off). Every (stage, microbatch, step) is a SimPy process that waits for its input (the
previous stage's send, or its own previous decode step), then walks its program, holding the
stream each op needs. Earlier steps and microbatches have priority on a stream. With overlap on,
one microbatch's collectives overlap another's kernels, and shared experts overlap the routed
experts' dispatch; pipeline bubbles come out of this schedule, not out of a formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from .program import Op, StageProgram

__all__ = ["Interval", "Executor"]


@dataclass(frozen=True)
class Interval:
    """One op on one stream of one stage (all its GPUs alike), in seconds."""

    stage: int
    stream: str
    name: str
    op: str
    layer: int
    microbatch: int
    step: int
    start: float
    end: float


def _plan(ops: list[Op], overlap: bool) -> list[tuple[str, object]]:
    """The program as ``("op", op)`` items; with overlap on, a branch (shared experts) becomes
    ``("fork", ops)`` that runs beside the main chain until ``("join", None)``: before the routed
    experts' output conversion (where the two are summed), or at the end of the layer."""
    if not overlap:
        return [("op", op) for op in ops]
    items: list[tuple[str, object]] = []
    fork_layer = None
    i = 0
    while i < len(ops):
        op = ops[i]
        if fork_layer is not None and (op.layer != fork_layer or op.name == "expert_ffn2->next"):
            items.append(("join", None))
            fork_layer = None
        if op.branch:
            j = i
            while j < len(ops) and ops[j].branch == op.branch and ops[j].layer == op.layer:
                j += 1
            items.append(("fork", ops[i:j]))
            fork_layer, i = op.layer, j
            continue
        items.append(("op", op))
        i += 1
    if fork_layer is not None:
        items.append(("join", None))
    return items


class Executor:
    """Owns the streams and the interval log of one simulated phase."""

    def __init__(self, env: simpy.Environment, programs: list[StageProgram], comm, overlap: bool):
        self.env, self.programs, self.comm, self.overlap = env, programs, comm, overlap
        self.streams = []
        for _ in programs:
            compute = simpy.PriorityResource(env, capacity=1)
            self.streams.append({"compute": compute,
                                 "comm": simpy.PriorityResource(env, capacity=1) if overlap else compute})
        self.plans = [_plan(p.ops, overlap) for p in programs]
        self.intervals: list[Interval] = []

    def _run_op(self, stage: int, op: Op, microbatch: int, step: int):
        stream = "comm" if op.is_comm else "compute"
        with self.streams[stage][stream].request(priority=step * 10_000 + microbatch) as req:
            yield req
            start = self.env.now
            if op.is_comm:
                yield from self.comm.run(self.env, stage, op)
            elif op.duration_s > 0:
                yield self.env.timeout(op.duration_s)
            self.intervals.append(Interval(stage, stream, op.name, op.op, op.layer, microbatch, step,
                                           start, self.env.now))

    def _branch(self, stage: int, ops: list[Op], microbatch: int, step: int):
        for op in ops:
            yield from self._run_op(stage, op, microbatch, step)

    def stage_pass(self, stage: int, microbatch: int, step: int, ready: simpy.Event):
        """Process: one microbatch through one stage, after ``ready`` fires."""
        yield ready
        branch = None
        for kind, item in self.plans[stage]:
            if kind == "op":
                yield from self._run_op(stage, item, microbatch, step)
            elif kind == "fork":
                branch = self.env.process(self._branch(stage, item, microbatch, step))
            elif branch is not None:
                yield branch
                branch = None
        return self.env.now

    def run_pipeline(self, microbatches: int, steps: int) -> list[list[float]]:
        """Run ``steps`` passes of every microbatch through all stages (decode steps chain each
        microbatch to its previous pass); returns finish times ``[step][microbatch]`` at the last stage."""
        env, pp = self.env, len(self.programs)
        finish = [[0.0] * microbatches for _ in range(steps)]
        ready = [env.event().succeed() for _ in range(microbatches)]
        procs = []
        for step in range(steps):
            for j in range(microbatches):
                event = ready[j]
                for p in range(pp):
                    event = env.process(self.stage_pass(p, j, step, event))
                procs.append((step, j, event))
                ready[j] = event
        env.run(until=env.all_of([e for _, _, e in procs]))
        for step, j, event in procs:
            finish[step][j] = event.value
        return finish
