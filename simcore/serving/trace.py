"""A serving run as a Chrome / Perfetto trace (open ``trace.json`` in ui.perfetto.dev or chrome://tracing).

:class:`ServingTrace` is a recorder the workers and the cluster call while a run goes (``None`` in
:func:`~simcore.serving.simulate_serving` by default, so an untraced run pays one ``is None`` test per
step). :meth:`ServingTrace.to_chrome` turns what it recorded into Chrome trace event JSON:

- a process ``requests``, a thread per sampled request: its spans ``queued`` (sent, not yet scheduled),
  ``prefill`` (one per chunk, ``tokens`` in its args), ``decode`` (from its first decode step to its end,
  a hand-off or a preemption), ``kv hand-off`` (a disaggregated plan's KV moving to the decode worker;
  a seesaw plan's ``parked in host memory``), ``waiting for decode`` (its KV arrived, no decode step
  yet) and ``preempted`` (KV dropped, until the step that recomputes it);
- a process per pool, a thread per worker (per pipeline stage with ``pp > 1``): every step as a span
  whose args give the sequences it ran (``seqs``) and its ``prefill_tokens`` and ``decode_tokens``; a run
  of identical decode steps the fast path takes at once (:meth:`Worker._decode_steps`) is one span
  ``decode xN`` with ``steps`` N and the tokens of each step;
- counters per pool, a sample kept only when a value moved (KV blocks by over 0.2 % of the pool's):
  ``requests`` (``running``, ``waiting``), ``KV blocks`` (``used``, ``free``) and ``tokens per step``
  (``prefill``, ``decode``);
- a process ``links``: the utilization (load / capacity) of the ``max_links`` busiest links that carried
  the KV hand-off flows (:meth:`simcore.network.FlowNetwork.utilization`).

Which requests get a thread: ``requests`` of them, spread evenly over the run (-1: all, 0: none).
Size: past ``max_steps`` step records in all, every ``k`` consecutive steps of a track become one span
(``xN`` in its name, ``steps`` N and per-step means in its args); past ``max_samples`` counter samples,
every ``k`` consecutive samples of a track become their mean; so ``trace.json`` stays a few MB (1000
requests at 64 clients: 0.2 MB with 64 requests' threads, on DeepSeek-V3 or Llama-3.1-70B; 2.7 MB with
a two-stage pipeline, every step taken one by one).
Timestamps are microseconds of simulated time (the trace format's unit), events sorted by time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from simcore.files import atomic_write_text
from simcore.serving.requests import Request

__all__ = ["ServingTrace", "write_serving_trace", "TRACE_REQUESTS"]

#: requests given a thread by default (``serving.trace_requests``)
TRACE_REQUESTS = 64
_US = 1e6  # trace timestamps are microseconds
_REQUESTS_PID = 1
_LINKS_PID = 99
_POOL_NAMES = {"both": "pool", "prefill": "prefill pool", "decode": "decode pool"}


def _us(t: float) -> float:
    return round(t * _US, 3)


class _Track:
    """Where one sampled request stands: its open span (``phase`` since ``since_s``; ``None``: none open),
    the end of its last step, the preemptions and tokens it had when they were last looked at."""

    __slots__ = ("phase", "since_s", "last_end_s", "preemptions", "generated")

    def __init__(self, phase: str | None, since_s: float, req: Request):
        self.phase, self.since_s, self.last_end_s = phase, since_s, since_s
        self.preemptions, self.generated = req.preemptions, req.generated


class ServingTrace:
    """Records a serving run for :meth:`to_chrome` (module docstring); ``requests``: how many requests
    get a thread (-1: all, 0: none); ``max_links``: link counter tracks kept, busiest first."""

    def __init__(self, requests: int = TRACE_REQUESTS, max_links: int = 32, max_steps: int = 16_000,
                 max_samples: int = 8_000):
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < -1:
            raise ValueError(f"serving.trace_requests must be an integer >= -1, got {requests!r}")
        self.requests, self.max_links = requests, max_links
        self.max_steps, self.max_samples = max_steps, max_samples
        self.sampled: set[int] = set()
        self.events: list[dict] = []
        self._tracks: dict[int, _Track] = {}  # rid -> where that sampled request stands
        self._workers: dict[int, list] = {}  # pool pid -> its workers
        self._pid_of: dict[int, int] = {}  # id(worker) -> pid
        #: (pid, tid) -> the track's steps: (start_s, end_s, steps, seqs, prefill tokens, decode tokens), per step
        self._steps: dict[tuple[int, int], list[tuple]] = {}
        self._counters: dict[tuple[int, str], list[tuple[float, tuple]]] = {}  # (pid, name) -> (t, values)

    # ----- set-up ---------------------------------------------------------------------------------
    def bind(self, num_requests: int, pools: dict[str, list]) -> None:
        """The run's requests (ids ``0 .. num_requests - 1``) and its workers by role."""
        k = num_requests if self.requests < 0 else min(self.requests, num_requests)
        self.sampled = {int(i * num_requests / k) for i in range(k)} if k else set()
        for rid in sorted(self.sampled):
            self._meta("thread_name", _REQUESTS_PID, {"name": f"request {rid}"}, tid=rid)
        if self.sampled:
            self._meta("process_name", _REQUESTS_PID, {"name": "requests"})
        for n, (role, workers) in enumerate(pools.items()):
            pid = _REQUESTS_PID + 1 + n
            self._workers[pid] = workers
            self._meta("process_name", pid, {"name": _POOL_NAMES.get(role, role)})
            for w in workers:
                self._pid_of[id(w)] = pid
                s = w.cost.strategy
                for stage in range(s.pp):
                    label = f"worker {w.wid} (tp{s.tp} ep{s.ep} pp{s.pp})" + (f" stage {stage}" if s.pp > 1 else "")
                    self._meta("thread_name", pid, {"name": label}, tid=self._tid(w, stage))

    def _meta(self, name: str, pid: int, args: dict, tid: int = 0) -> None:
        self.events.append({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args})

    @staticmethod
    def _tid(worker, stage: int) -> int:
        return worker.wid * 64 + stage

    def _span(self, name: str, pid: int, tid: int, start_s: float, end_s: float, args: dict | None = None,
              cat: str = "request") -> None:
        ts = _us(start_s)  # the end rounded as the start is, so that back-to-back spans never overlap
        ev = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts,
              "dur": round(max(_us(end_s) - ts, 0.0), 3)}
        if args:
            ev["args"] = args
        self.events.append(ev)

    # ----- requests ---------------------------------------------------------------------------------
    def arrived(self, req: Request, t: float) -> None:
        """``req`` was sent at ``t`` (queued until its first step)."""
        if req.rid in self.sampled:
            self._tracks[req.rid] = _Track("queued", t, req)

    def _close(self, req: Request, tr: _Track, end_s: float) -> None:
        """End the open span of ``req`` at ``end_s`` (a decode span counts the tokens it emitted)."""
        if tr.phase == "decode":
            self._span("decode", _REQUESTS_PID, req.rid, tr.since_s, end_s, {"tokens": req.generated - tr.generated})
        elif tr.phase in ("queued", "waiting for decode", "preempted") and end_s > tr.since_s:
            self._span(tr.phase, _REQUESTS_PID, req.rid, tr.since_s, end_s)
        tr.phase = None

    def _request_step(self, req: Request, n: int, start_s: float, end_s: float) -> None:
        tr = self._tracks.setdefault(req.rid, _Track("queued", start_s, req))
        if req.preemptions > tr.preemptions:  # preempted since its last step: KV dropped at the end of that step
            if tr.phase == "decode":
                self._close(req, tr, tr.last_end_s)
            tr.phase, tr.since_s, tr.preemptions = "preempted", tr.last_end_s, req.preemptions
        if req.in_prefill:
            if tr.phase is not None:
                self._close(req, tr, start_s)
            self._span("prefill", _REQUESTS_PID, req.rid, start_s, end_s, {"tokens": n})
        elif tr.phase != "decode":
            if tr.phase is not None:
                self._close(req, tr, start_s)
            tr.phase, tr.since_s, tr.generated = "decode", start_s, req.generated
        tr.last_end_s = end_s

    def hand_off(self, req: Request, t: float) -> None:
        """``req``'s prompt is done at ``t`` and its KV leaves for the decode side."""
        tr = self._tracks.get(req.rid)
        if tr is not None:
            if tr.phase is not None:
                self._close(req, tr, t)
            tr.phase, tr.since_s = "hand-off", t

    def handed(self, req: Request, t: float, name: str, args: dict | None = None) -> None:
        """``req``'s KV reached the decode side at ``t``: the span since :meth:`hand_off`, named ``name``."""
        tr = self._tracks.get(req.rid)
        if tr is not None and tr.phase == "hand-off":
            self._span(name, _REQUESTS_PID, req.rid, tr.since_s, t, args)
            tr.phase, tr.since_s, tr.last_end_s = "waiting for decode", t, t

    def finished(self, req: Request) -> None:
        """``req`` emitted its last token (at ``req.finish_s``)."""
        tr = self._tracks.get(req.rid)
        if tr is not None and tr.phase is not None:
            self._close(req, tr, req.finish_s)

    # ----- workers ------------------------------------------------------------------------------------
    def step(self, worker, picks, start_s: float, end_s: float, steps: int = 1, stages=None) -> None:
        """A step of ``worker`` (or ``steps`` identical decode steps) running ``picks`` (its attention
        groups' ``(request, tokens)``) from ``start_s`` to ``end_s``, before the worker applies it;
        ``stages``: each pipeline stage's ``(start_s, end_s)`` when ``pp > 1``."""
        prefill = decode = seqs = 0
        for pick in picks:
            for req, n in pick:
                seqs += 1
                if req.in_prefill:
                    prefill += n
                else:
                    decode += n
                if req.rid in self.sampled:
                    self._request_step(req, n, start_s, end_s)
        pid = self._pid_of[id(worker)]
        for stage, (a, b) in enumerate(stages or [(start_s, end_s)]):
            self._steps.setdefault((pid, self._tid(worker, stage)), []).append((a, b, steps, seqs, prefill, decode))
        self._counter(pid, "tokens per step", start_s, {"prefill": prefill, "decode": decode})

    def counters(self, worker, t: float) -> None:
        """The pool of ``worker``: its running and waiting requests and KV blocks at ``t``."""
        pid = self._pid_of[id(worker)]
        groups = [g for w in self._workers[pid] for g in w.groups]
        self._counter(pid, "requests", t, {"running": sum(len(g.running) for g in groups),
                                           "waiting": sum(len(g.waiting) for g in groups)})
        free, total = sum(g.kv.free_blocks for g in groups), sum(g.kv.total_blocks for g in groups)
        self._counter(pid, "KV blocks", t, {"used": total - free, "free": free}, resolution=total / 500)

    def _counter(self, pid: int, name: str, t: float, values: dict, resolution: float = 0.0) -> None:
        """Keep a counter sample if a value moved since the last one kept, by more than ``resolution``
        (KV blocks: 0.2 % of the pool's, so that a block a step does not make a sample a step)."""
        series = self._counters.setdefault((pid, name), [])
        if series and all(abs(v - series[-1][1][k]) <= resolution for k, v in values.items()):
            return
        series.append((t, values))

    # ----- the network ------------------------------------------------------------------------------
    def links(self, utilization: dict) -> None:
        """Counter tracks of the ``max_links`` busiest links of ``utilization`` (link -> ``(t, load /
        capacity)`` steps, :meth:`simcore.network.FlowNetwork.utilization`), by load integrated over time."""
        def busy(series):
            return sum(u * (t1 - t0) for (t0, u), (t1, _) in zip(series, series[1:], strict=False))

        busiest = sorted(utilization.items(), key=lambda kv: (-busy(kv[1]), kv[0]))[: self.max_links]
        if busiest:
            self._meta("process_name", _LINKS_PID, {"name": "links (KV hand-off flows)"})
        for (u, v), series in busiest:
            self._counters[_LINKS_PID, f"{u}->{v}"] = [(t, {"utilization": frac}) for t, frac in series]

    # ----- out ----------------------------------------------------------------------------------------
    def to_chrome(self) -> dict:
        """``{"traceEvents": [...]}``: metadata first, then every event by time. Over ``max_steps`` step
        records, every ``k`` consecutive steps of a track are one span (``steps`` in its args, the per-step
        values their mean); over ``max_samples`` counter samples, every ``k`` consecutive samples of a
        track are one, their mean: the file stays a few MB however long the run."""
        events = list(self.events)
        k = max(math.ceil(sum(len(v) for v in self._steps.values()) / self.max_steps), 1)
        for (pid, tid), records in self._steps.items():
            for i in range(0, len(records), k):
                events.append(_step_span(pid, tid, records[i:i + k]))
        k = max(math.ceil(sum(len(v) for v in self._counters.values()) / self.max_samples), 1)
        for (pid, name), series in self._counters.items():
            for i in range(0, len(series), k):
                chunk = series[i:i + k]
                args = chunk[0][1] if k == 1 else {f: sum(v[f] for _, v in chunk) / len(chunk) for f in chunk[0][1]}
                events.append({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": _us(chunk[0][0]),
                               "args": {f: round(v, 4) if isinstance(v, float) else v for f, v in args.items()}})
        meta = [e for e in events if e["ph"] == "M"]
        timed = sorted((e for e in events if e["ph"] != "M"), key=lambda e: e["ts"])
        return {"traceEvents": meta + timed, "displayTimeUnit": "ms"}


def _step_span(pid: int, tid: int, records: list[tuple]) -> dict:
    """One span for consecutive step records of a track: named for what they ran (``decode x37``: 37
    decode steps), their per-step sequences and tokens in its args (means over several steps)."""
    steps = sum(r[2] for r in records)
    seqs, prefill, decode = (sum(r[2] * r[j] for r in records) / steps for j in (3, 4, 5))
    name = "decode" if not prefill else ("prefill" if not decode else "prefill+decode")
    exact = len(records) == 1
    args = {"seqs": seqs, "prefill_tokens": prefill, "decode_tokens": decode}
    args = {n: int(v) if exact else round(v, 1) for n, v in args.items()}
    if steps > 1:
        name, args = f"{name} x{steps}", args | {"steps": steps}
    ts = _us(records[0][0])
    return {"ph": "X", "name": name, "cat": "step", "pid": pid, "tid": tid, "ts": ts,
            "dur": round(max(_us(records[-1][1]) - ts, 0.0), 3), "args": args}


def write_serving_trace(path: str | Path, trace: ServingTrace) -> Path:
    """``trace`` as compact JSON at ``path``, atomically (:func:`simcore.files.atomic_write_text`)."""
    chrome = trace.to_chrome()
    bad = [e for e in chrome["traceEvents"] if "ts" in e and not math.isfinite(e["ts"])]
    if bad:
        raise ValueError(f"serving trace: an event at a non-finite time: {bad[0]}")
    return atomic_write_text(path, json.dumps(chrome, separators=(",", ":")))
