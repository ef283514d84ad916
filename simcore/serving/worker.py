"""One serving worker as SimPy processes: the host that forms steps, and the GPU pipeline that runs them.

A worker is one model replica on ``tp * ep * pp`` GPUs. Its ``ep`` attention groups each keep their
own scheduler and KV cache (:class:`~simcore.serving.scheduler.GroupScheduler`) and step together.
A step is formed on the host, then runs through the ``pp`` pipeline stages (each a SimPy resource, so
up to ``pp`` steps are in flight, as vLLM's virtual engines and SGLang's PP micro-batches are); its
tokens are emitted when it leaves the last stage.

Host time per step (:meth:`RuntimeProfile.host_s`: a fixed part plus a part per sequence in the step)
is spent by each attention group's own scheduler process, in parallel (:func:`step_host_s`), and either
runs before the step it prepares (synchronous runtimes) or overlaps the previous step's GPU work
(SGLang and TensorRT-LLM's overlap schedulers): consecutive steps then start at least that far apart. The GPU time of a step,
CUDA graph or eager, is :meth:`StepCost.gpu_times`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import simpy

from simcore.serving.frontend import Frontend
from simcore.serving.kvcache import KvCache, state_blocks
from simcore.serving.requests import Request
from simcore.serving.runtime import RuntimeProfile
from simcore.serving.scheduler import AttentionDpBalance, GroupScheduler
from simcore.serving.speculative import emitted
from simcore.serving.step_cost import GroupBatch, StepCost

__all__ = ["Worker", "PlanInfeasible", "step_host_s"]


def step_host_s(runtime: RuntimeProfile, picks: list[list[tuple[Request, int]]]) -> float:
    """Host time of a step whose attention groups run ``picks``: under attention data parallelism
    every group has its own scheduler process preparing its own sequences (TensorRT-LLM one
    ``PyExecutor`` per rank with ``enable_attention_dp``, SGLang one ``Scheduler`` per DP rank, vLLM one
    ``EngineCore`` per data-parallel rank), so the step waits for the busiest group's host, not for the
    sum over groups."""
    return runtime.host_s(max((len(p) for p in picks), default=0))


class PlanInfeasible(ValueError):
    """The plan cannot serve the requests at all (e.g. one request's KV exceeds the cache)."""


class Worker:
    """``role``: ``both`` (aggregated), ``prefill`` (hands requests off after their first token) or
    ``decode`` (receives requests whose prompt KV arrived)."""

    def __init__(self, env: simpy.Environment, wid: int, cost: StepCost, runtime: RuntimeProfile,
                 kv_tokens: int, max_num_seqs: int, on_finish: Callable[[Request], None],
                 role: str = "both", on_prefilled: Callable[[Request, Worker], None] | None = None,
                 fast: bool = True, trace=None):
        self.env, self.wid, self.cost, self.runtime, self.role = env, wid, cost, runtime, role
        self.trace = trace  # a simcore.serving.trace.ServingTrace, or None (not tracing)
        self.on_finish, self.on_prefilled = on_finish, on_prefilled
        groups = cost.strategy.ep
        seqs = max(max_num_seqs // groups, 1)
        state = state_blocks(cost.ctx, cost.strategy, runtime.kv_block_tokens)
        # TensorRT-LLM waits for context batches only without attention DP (``not enable_attention_dp``)
        wait = (runtime.batch_wait_timeout_iters, runtime.batch_wait_max_tokens_ratio) if groups == 1 else (0, 0.0)
        self.decode_q = 1 + runtime.spec_tokens  # tokens a decoding sequence runs per step (speculative.py)
        self.groups = [GroupScheduler(runtime.scheduler, KvCache(kv_tokens, runtime.kv_block_tokens, state), seqs,
                                      runtime.max_num_batched_tokens, wait, reserve_output=role == "both",
                                      decode_q=self.decode_q)
                       for _ in range(groups)]
        self.balance = AttentionDpBalance(runtime.attention_dp_timeout_iters, runtime.attention_dp_batching_wait_iters) \
            if runtime.attention_dp_balance and groups > 1 else None
        self.stages = [simpy.Resource(env, capacity=1) for _ in range(cost.strategy.pp)]
        self._rr = itertools.cycle(range(groups))
        self._wake = env.event()
        self._busy: set[int] = set()
        self._host_free = 0.0
        self.steps = 0
        self.incoming = 0  # hand-offs routed here whose KV transfer has not finished
        self.gpu_busy_s = 0.0
        # the pure-decode steps taken: their count, and the sums over them of the busiest attention group's
        # decoding sequences and of the decodes' mean context (what :mod:`.breakdown` prices the mean step at)
        self.decode_steps, self.decode_seqs_sum, self.decode_context_sum = 0, 0.0, 0.0
        self.fast = fast
        #: a :class:`~simcore.serving.fabric.WorkerFabric` where some of its steps' communication runs as
        #: flows on the plan's network (set by the cluster before the first step), else None: closed form
        self.net = None
        #: the process that streams its tokens and takes new requests in (:mod:`~simcore.serving.frontend`);
        #: while it is active, steps are taken one by one (a new request waits behind each step's stream)
        self.frontend = Frontend(runtime.frontend_token_s)
        self.entering = 0  # new requests waiting behind the frontend's backlog
        env.process(self._loop())

    # ------------------------------------------------------------------ requests in
    def submit(self, req: Request) -> None:
        """A new request (or, on a decode worker, one whose KV arrived)."""
        g = next(self._rr)
        kv = self.groups[g].kv
        if kv.blocks_alone(req.input_len + req.output_len) > kv.total_blocks:
            state = f" plus {kv.state_blocks * kv.block_tokens} tokens' worth of state" if kv.state_blocks else ""
            raise PlanInfeasible(f"kv_capacity: one request of {req.input_len}+{req.output_len} tokens{state} needs "
                                 f"more KV than an attention group holds ({kv.total_blocks * kv.block_tokens} tokens)")
        wait = self.frontend.backlog_s(self.env.now) if self.role != "decode" else 0.0
        if wait > 0:  # a new request waits behind the tokens its frontend is still streaming
            self.entering += 1
            self.env.process(self._enter_after(req, g, wait))
        else:
            self._enter(req, g)

    def _enter_after(self, req: Request, g: int, wait: float):
        yield self.env.timeout(wait)
        self.entering -= 1
        self._enter(req, g)

    def _enter(self, req: Request, g: int) -> None:
        req.group = g
        if self.role == "decode":
            req.kv_tokens = req.prefill_target  # the prompt's KV came from the prefill worker
        self.groups[g].add(req)
        self._poke()

    @property
    def load(self) -> int:
        """Outstanding requests: those its groups hold, and those routed here whose KV is still on its
        way (a disaggregated hand-off counts from the moment it is routed, as a router counts it)."""
        return sum(g.load for g in self.groups) + self.incoming + self.entering

    def _poke(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    # ------------------------------------------------------------------ the step loop
    def _schedule(self) -> list[list[tuple[Request, int]]]:
        picks = [g.schedule(self._busy) for g in self.groups]
        return self.balance.apply(picks, self.groups) if self.balance else picks

    def _picks_or_wait(self):
        """The next step's picks, or ``None`` after sleeping until a request arrives or a step ends."""
        picks = self._schedule()
        if any(picks):
            return picks
        self._wake = self.env.event()
        yield self._wake
        return None

    def _loop(self):
        if self.cost.strategy.pp == 1 and self.fast:
            yield from self._loop_single_stage()
        else:
            yield from self._loop_pipeline()

    def _host_start(self, picks):
        """Wait out the host time of the step about to start (see the module docstring)."""
        host = step_host_s(self.runtime, picks)
        if self.runtime.overlap_host:  # prepared while the previous step ran
            start = max(self.env.now, self._host_free)
            self._host_free = start + host
            if start > self.env.now:
                yield self.env.timeout(start - self.env.now)
        elif host > 0:
            yield self.env.timeout(host)

    def _loop_pipeline(self):
        """The reference loop: every step a process through the ``pp`` stage resources."""
        while True:
            picks = yield from self._picks_or_wait()
            if picks is None:
                continue
            yield from self._host_start(picks)
            for pick in picks:
                self._busy.update(r.rid for r, _ in pick)
            times = self._stage_times(picks)
            self.steps += 1
            entered = self.env.event()
            self.env.process(self._run_step(picks, times, entered, self._batches))
            yield entered  # the next step forms once this one left the first stage

    def _loop_single_stage(self):
        """One stage: steps run back to back in this process. A run of pure-decode steps whose batch
        cannot change (no arrival, no completion before its last step, KV for every step) is taken as
        one timeout (:func:`decode_run`); an arrival during it cuts the run at the step in progress,
        which is where step-by-step scheduling would first have seen it (test: fast == reference)."""
        while True:
            picks = yield from self._picks_or_wait()
            if picks is None:
                continue
            run = self._decode_run(picks)
            if run <= 1:
                yield from self._host_start(picks)
                t = sum(self._stage_times(picks))
                self.steps += 1
                if self.net is None:
                    yield self.env.timeout(t)
                else:  # its communication as flows on the shared network (fabric.py)
                    t = yield from self.net.run(0, t, self._batches)
                self.gpu_busy_s += t
                if self.trace is not None:
                    self.trace.step(self, picks, self.env.now - t, self.env.now)
                self._apply(picks)
                continue
            yield from self._decode_steps(picks, run)

    def _decode_run(self, picks) -> int:
        """How many identical pure-decode steps may be taken at once (1: take one step normally)."""
        if self.decode_q > 1 or (self.net is not None and self.net.active) or self.frontend.active:
            return 1  # speculative decoding: tokens per step differ; flows: each step meets other traffic
        reqs = [r for pick in picks for r, n in pick]
        if any(r.in_prefill for r in reqs) or any(g.waiting and self._may_admit(g) for g in self.groups):
            return 1
        if any(len(pick) != len(g.running) for g, pick in zip(self.groups, picks, strict=True)):
            return 1
        run = min(r.output_len - r.generated for r in reqs)
        if self.runtime.scheduler != "trtllm":  # KV grows a token a step (trtllm reserved it all)
            for g, pick in zip(self.groups, picks, strict=True):
                while run > 1 and sum(g.kv.need(r, r.kv_tokens + run) for r, _ in pick) > g.kv.free_blocks:
                    run //= 2
        return run

    def _may_admit(self, g) -> bool:
        """Whether a waiting request could join during a decode run (then runs are not taken)."""
        return len(g.running) < g.max_num_seqs and g.kv.free_blocks > 0

    def _decode_steps(self, picks, run: int):
        sums = [float(sum(r.kv_tokens + 1 for r, _ in pick)) for pick in picks]
        sizes = [len(pick) for pick in picks]
        host, overlap = step_host_s(self.runtime, picks), self.runtime.overlap_host
        start = max(self.env.now, self._host_free) if overlap else self.env.now + host
        starts, ends = [], []
        for j in range(run):
            batches = [GroupBatch([], n, c + j * n, n) for c, n in zip(sums, sizes, strict=True)]
            t = sum(self.cost.gpu_times(batches, self.runtime))
            starts.append(start)
            ends.append(start + t)
            start = max(start + t, start + host) if overlap else start + t + host
        self._wake = self.env.event()
        yield self.env.timeout(ends[-1] - self.env.now) | self._wake
        done = run
        if self.env.now < ends[-1]:  # cut short by an arrival: finish the step in progress
            done = next(j for j, e in enumerate(ends) if e > self.env.now) + 1
            yield self.env.timeout(ends[done - 1] - self.env.now)
        if overlap:
            self._host_free = starts[done - 1] + host
        self.steps += done
        if self.balance:  # each further folded step ticks the balancing count
            self.balance.decode_steps(done - 1, all(sizes))  # the first was ticked when it was scheduled
        for group in self.groups:  # and each group's own per-step state
            group.decode_steps(done - 1)
        self.gpu_busy_s += sum(e - s for s, e in zip(starts[:done], ends[:done], strict=True))
        n = sum(sizes)  # step j's decodes attend to (sum(sums) + j n) / n tokens on average
        self._count_decodes(done, max(sizes), done * sum(sums) / n + done * (done - 1) / 2)
        if self.trace is not None:
            self.trace.step(self, picks, starts[0], ends[done - 1], steps=done)
        times = ends[:done]
        for group, pick in zip(self.groups, picks, strict=True):
            for req, _ in pick:
                req.kv_tokens += done
                req.generated += done
                req.release_first(times[0])
                req.token_times.extend(times)
                if req.done:
                    req.finish_s = times[-1]
                    group.finish(req)
                    self.on_finish(req)
        if self.trace is not None:
            self.trace.counters(self, self.env.now)
        self._poke()

    def _count_decodes(self, steps: int, busiest: int, context_sum: float) -> None:
        """Count ``steps`` pure-decode steps whose busiest group ran ``busiest`` sequences and whose
        decodes' mean contexts sum to ``context_sum``."""
        self.decode_steps += steps
        self.decode_seqs_sum += steps * busiest
        self.decode_context_sum += context_sum

    def _stage_times(self, picks) -> list[float]:
        batches = []
        for pick in picks:
            chunks = [(n, r.kv_tokens) for r, n in pick if r.in_prefill]
            decodes = [r.kv_tokens + 1 for r, n in pick if not r.in_prefill]
            # a prompt's last chunk samples one token; a decode samples each of its 1 + drafts
            sampled = sum(1 for r, n in pick if r.in_prefill and r.kv_tokens + n >= r.prefill_target)
            batches.append(GroupBatch.of(chunks, decodes, sampled + len(decodes) * self.decode_q, self.decode_q))
        self._batches = batches
        if not any(b.chunks for b in batches):
            seqs = sum(b.decode_seqs for b in batches)
            if seqs:
                self._count_decodes(1, max(b.decode_seqs for b in batches),
                                    sum(b.decode_context_sum for b in batches) / seqs)
        return self.cost.gpu_times(batches, self.runtime)

    def _run_step(self, picks, times: list[float], entered: simpy.Event, batches=None):
        held = None
        spans = []  # each stage's (start, end), for the trace
        for i, t in enumerate(times):
            request = self.stages[i].request()
            yield request
            if held is not None:
                self.stages[i - 1].release(held)
            held = request
            begin = self.env.now
            if self.net is None:
                yield self.env.timeout(t)
            else:  # its communication as flows on the shared network (fabric.py)
                t = yield from self.net.run(i, t, batches)
            spans.append((begin, begin + t))
            self.gpu_busy_s += t
            if i == 0:  # left the first stage: the next step may enter it
                entered.succeed()
        self.stages[-1].release(held)
        if self.trace is not None:
            self.trace.step(self, picks, spans[0][0], self.env.now, stages=spans)
        self._apply(picks)

    def _apply(self, picks) -> None:
        now = self.env.now
        ended = []  # (request, its group, whether it sampled) for each request the step advanced
        streamed = []  # the requests that emitted tokens, and how many, for the frontend
        for group, pick in zip(self.groups, picks, strict=True):
            for req, n in pick:
                self._busy.discard(req.rid)
                if req not in group.running:  # preempted while in flight: its work is void
                    continue
                before = len(req.token_times)
                if self.decode_q > 1 and not req.in_prefill:  # keeps the drafts it accepted
                    kept = emitted(req, self.runtime.tokens_per_step)
                    sampled = req.advance(kept, now, emit=kept)
                else:
                    sampled = req.advance(n, now)
                if len(req.token_times) > before:
                    streamed.append((req, len(req.token_times) - before))
                ended.append((req, group, sampled))
        if self.frontend.active and self.role != "prefill" and streamed:
            seen = self.frontend.emit(now, sum(k for _, k in streamed))
            for req, k in streamed:
                req.streamed_at(now, seen, k)
        for req, group, sampled in ended:
            if req.done:
                group.finish(req)
                self.on_finish(req)
            elif sampled and self.role == "prefill":
                group.finish(req)  # KV leaves with the hand-off
                self.on_prefilled(req, self)
        if self.trace is not None:
            self.trace.counters(self, now)
        self._poke()
