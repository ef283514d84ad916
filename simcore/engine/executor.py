"""Runs stage programs on SimPy: streams, microbatches, the pipeline schedule.

Each pipeline stage has a compute stream and a communication stream (one stream for both when
overlap is off). Every (stage, microbatch, step) is a SimPy process that waits for its input (the
previous stage's send, or its own previous decode step), then walks its program, holding the
stream each op needs. Earlier steps and microbatches have priority on a stream. With overlap on,
one microbatch's collectives overlap another's kernels, and shared experts overlap the routed
experts' dispatch; pipeline bubbles come out of this schedule, not out of a formula.

SM sharing (overlap on): an NCCL kernel holds one SM per channel while it runs (one CTA per channel;
``comm.kernel_sms(stage, op)`` of ``comm.num_sms``), so kernels overlapping it run at the fraction of
the SMs left, re-timed whenever a collective starts or ends on the stage. A comm without
``kernel_sms`` holds none.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from simcore.engine.program import Op, StageProgram

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


def _segments(items: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Merge runs of consecutive compute ops into ``("seg", ops)``: one microbatch's kernels between
    two collectives are issued back to back on its compute stream (as a captured CUDA graph is), so
    they hold the stream together and cost one simulator event instead of one each. Branch ops are
    merged inside their fork the same way."""
    out: list[tuple[str, object]] = []
    for kind, item in items:
        if kind == "fork":
            out.append(("fork", _segments([("op", op) for op in item])))
        elif kind == "op" and not item.is_comm and out and out[-1][0] == "seg":
            out[-1][1].append(item)
        elif kind == "op" and not item.is_comm:
            out.append(("seg", [item]))
        else:
            out.append((kind, item))
    return out


class Executor:
    """Owns the streams and the interval log of one simulated phase.

    Overlap off: each stage has one stream that a microbatch holds for its whole stage pass, in
    order (one CUDA stream, as the proxy assumes). Overlap on: a preemptive-priority compute stream
    and a communication stream; the earliest (step, microbatch) has priority, so a later microbatch
    fills the compute stream only while earlier ones wait on communication, and yields it back as
    soon as they return (kernel-boundary preemption, as CUDA stream priorities do).
    """

    def __init__(self, env: simpy.Environment, programs: list[StageProgram], comm, overlap: bool):
        self.env, self.programs, self.comm, self.overlap = env, programs, comm, overlap
        self.streams = []
        for _ in programs:
            if overlap:
                self.streams.append({"compute": simpy.PreemptiveResource(env, capacity=1),
                                     "comm": simpy.PriorityResource(env, capacity=1)})
            else:
                self.streams.append({"stage": simpy.Resource(env, capacity=1)})
        self.plans = [_segments(_plan(p.ops, overlap)) for p in programs]
        self.intervals: list[Interval] = []
        self._num_sms = int(getattr(comm, "num_sms", 0) or 0)
        self._kernel_sms = getattr(comm, "kernel_sms", None) if self._num_sms > 0 else None
        self._held: dict[int, int] = {}  # SMs held by NCCL kernels per stage
        self._running: dict[int, list] = {}  # the kernels running per stage (see _retime)

    def _log(self, stage, stream, op: Op, microbatch, step, start, end) -> None:
        self.intervals.append(Interval(stage, stream, op.name, op.op, op.layer, microbatch, step, start, end))

    def _comm(self, stage: int, op: Op, microbatch: int, step: int):
        start = self.env.now
        yield from self.comm.run(self.env, stage, op)
        self._log(stage, "comm", op, microbatch, step, start, self.env.now)

    def _comm_on_sms(self, stage: int, op: Op, microbatch: int, step: int):
        """:meth:`_comm` while its kernel holds its SMs (module docstring)."""
        sms = int(self._kernel_sms(stage, op)) if self._kernel_sms is not None else 0
        if sms <= 0:
            yield from self._comm(stage, op, microbatch, step)
            return
        self._hold_sms(stage, sms)
        try:
            yield from self._comm(stage, op, microbatch, step)
        finally:
            self._hold_sms(stage, -sms)

    def _hold_sms(self, stage: int, sms: int) -> None:
        self._held[stage] = self._held.get(stage, 0) + sms
        running = self._running.get(stage)
        if running is not None:  # the kernels in flight change speed now
            self._retime(stage, running)

    def _rate(self, stage: int) -> float:
        return 1.0 - min(self._held.get(stage, 0), self._num_sms - 1) / self._num_sms

    def _retime(self, stage: int, running: list) -> None:
        """``running`` = [work left, rate, since, version, done event]: bank the work done at the old rate
        and re-arm the finish at the new one; a superseded timer fires as a no-op (version)."""
        now = self.env.now
        running[0] -= (now - running[2]) * running[1]
        running[1], running[2], running[3] = self._rate(stage), now, running[3] + 1
        version, done = running[3], running[4]

        def fire(_event, version=version):
            if running[3] == version and not done.triggered:
                done.succeed()
        self.env.timeout(max(running[0], 0.0) / running[1]).callbacks.append(fire)

    def _work(self, stage: int, work: float, done: list[float]):
        """``work`` seconds of kernels (at all SMs) at the fraction of SMs NCCL kernels leave; ``done[0]``
        is the work finished, kept current when an interrupt (preemption) ends it early. Performance:
        one event and one timeout per kernel run, one more timeout per collective start or end."""
        running = self._running[stage] = [work, self._rate(stage), self.env.now, 0, self.env.event()]
        self._retime(stage, running)
        try:
            yield running[4]
            done[0] = work
        except simpy.Interrupt:
            done[0] = min(work, work - running[0] + (self.env.now - running[2]) * running[1])
            raise
        finally:
            running[3] = -1  # disarm
            if self._running.get(stage) is running:
                del self._running[stage]

    def _compute(self, stage: int, ops: list[Op], microbatch: int, step: int):
        """Kernels back to back; with overlap on, preemptible between (and within) kernels."""
        left = [op.duration_s for op in ops]
        i = 0
        while i < len(ops):
            if not self.overlap:
                start = self.env.now
                yield self.env.timeout(sum(left[i:]))
                for op, d in zip(ops[i:], left[i:], strict=True):
                    self._log(stage, "compute", op, microbatch, step, start, start + d)
                    start += d
                return
            with self.streams[stage]["compute"].request(priority=step * 10_000 + microbatch) as req:
                try:
                    yield req
                except simpy.Interrupt:  # granted, then preempted before it ran: queue again
                    continue
                start, done = self.env.now, [0.0]
                try:
                    if self._kernel_sms is None:
                        yield self.env.timeout(sum(left[i:]))
                    else:
                        yield from self._work(stage, sum(left[i:]), done)
                    elapsed = float("inf")
                except simpy.Interrupt:  # an earlier microbatch came back from communication
                    elapsed = done[0] if self._kernel_sms is not None else self.env.now - start
                # wall seconds per second of work (SM sharing), spread evenly over the span for the log
                stretch = (self.env.now - start) / done[0] if done[0] > 0 else 1.0
                t = start
                while i < len(ops) and (left[i] <= elapsed + 1e-15 or elapsed == float("inf")):
                    self._log(stage, "compute", ops[i], microbatch, step, t, t + left[i] * stretch)
                    t += left[i] * stretch
                    elapsed -= left[i]
                    i += 1
                if i < len(ops) and elapsed > 0:  # the kernel cut short resumes later
                    self._log(stage, "compute", ops[i], microbatch, step, t, t + elapsed * stretch)
                    left[i] -= elapsed

    def _run_items(self, stage: int, items, microbatch: int, step: int):
        branch = None
        for kind, item in items:
            if kind == "seg":
                yield from self._compute(stage, item, microbatch, step)
            elif kind == "op" and self.overlap:
                with self.streams[stage]["comm"].request(priority=step * 10_000 + microbatch) as req:
                    yield req
                    yield from self._comm_on_sms(stage, item, microbatch, step)
            elif kind == "op":
                yield from self._comm(stage, item, microbatch, step)
            elif kind == "fork":
                branch = self.env.process(self._run_items(stage, item, microbatch, step))
            elif branch is not None:
                yield branch
                branch = None

    def stage_pass(self, stage: int, microbatch: int, step: int, ready: simpy.Event):
        """Process: one microbatch through one stage, after ``ready`` fires; value: its finish time."""
        yield ready
        if self.overlap:
            yield from self._run_items(stage, self.plans[stage], microbatch, step)
        else:
            with self.streams[stage]["stage"].request() as req:
                yield req
                yield from self._run_items(stage, self.plans[stage], microbatch, step)
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
