"""Chrome / Perfetto trace of a simulated phase (open in ui.perfetto.dev or chrome://tracing).

A process per node, a thread per GPU stream (compute, comm), every process and thread named.
Per-GPU mode draws every GPU (a lane that stands for several proven-identical GPUs is drawn on each
of them, up to ``max_events``; past that on its first GPU, and the thread name says so); folded
mode draws each stage on its first GPU (the thread name says how many GPUs it stands for).
Collectives also appear as async events, and links as counter tracks of their utilization: the
flow solver's timelines plus the analytic occupancy of collectives that skipped it
(:mod:`simcore.engine.occupancy`).
"""

from __future__ import annotations

import json
from pathlib import Path

from simcore.engine.executor import Interval
from simcore.engine.occupancy import analytic_timelines, merge
from simcore.files import atomic_write_text

__all__ = ["chrome_trace", "write_trace"]

_US = 1e6  # trace timestamps are microseconds
_LINKS_PID = 100_000


def chrome_trace(intervals: list[Interval], lanes, graph, utilization: dict | None = None,
                 analytic: list | None = None, ctx=None, per_gpu: bool = False, max_counters: int = 64,
                 max_events: int = 2_000_000) -> dict:
    """Build the trace dict (``traceEvents`` plus metadata). ``intervals[k].stage`` indexes ``lanes``."""
    events: list[dict] = []
    named_pids: set[int] = set()
    by_lane: dict[int, list[Interval]] = {}
    for iv in intervals:
        by_lane.setdefault(iv.stage, []).append(iv)
    budget = max_events
    for lane in lanes:
        ivs = by_lane.get(lane.index, [])
        gpus = lane.gpus if per_gpu and len(ivs) * len(lane.gpus) <= budget else lane.gpus[:1]
        budget -= len(ivs) * len(gpus)
        for gpu in gpus:
            node = int(graph.nodes[gpu].get("node", 0))
            local = int(graph.nodes[gpu].get("local", 0))
            if node not in named_pids:
                named_pids.add(node)
                events.append({"ph": "M", "name": "process_name", "pid": node, "args": {"name": f"node {node}"}})
            tids = {}
            for k, stream in enumerate(("compute", "comm")):
                tids[stream] = local * 2 + k
                label = f"{gpu} {stream} (stage {lane.stage})"
                if len(gpus) < len(lane.gpus):
                    label = f"{gpu} {stream} (stage {lane.stage}, stands for {len(lane.gpus)} GPUs)"
                events.append({"ph": "M", "name": "thread_name", "pid": node, "tid": tids[stream],
                               "args": {"name": label}})
            _spans(events, ivs, node, tids, f"{gpu}:")
    _counters(events, graph, utilization or {}, analytic or [], ctx, max_counters)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _spans(events: list[dict], ivs: list[Interval], pid: int, tids: dict[str, int], prefix: str) -> None:
    for n, iv in enumerate(ivs):
        tid = tids.get(iv.stream, tids["compute"])
        args = {"op": iv.op, "layer": iv.layer, "microbatch": iv.microbatch, "step": iv.step}
        events.append({"ph": "X", "name": iv.name, "cat": iv.stream, "pid": pid, "tid": tid,
                       "ts": iv.start * _US, "dur": (iv.end - iv.start) * _US, "args": args})
        if iv.stream == "comm":
            for ph, ts in (("b", iv.start), ("e", iv.end)):
                events.append({"ph": ph, "name": iv.name, "cat": "collective", "id": f"{prefix}{n}", "pid": pid,
                               "tid": tid, "ts": ts * _US})


def _counters(events: list[dict], graph, utilization: dict, analytic: list, ctx, max_counters: int) -> None:
    """Utilization counter tracks of the busiest links (by utilization integrated over time)."""
    constants = None if ctx is None else ctx.collective_constants
    timelines = merge(utilization, analytic_timelines(graph, analytic, constants=constants))
    if not timelines:
        return

    def busy(series):
        return sum(u * (t1 - t0) for (t0, u), (t1, _) in zip(series, series[1:], strict=False))

    busiest = sorted(timelines.items(), key=lambda kv: (-busy(kv[1]), kv[0]))
    events.append({"ph": "M", "name": "process_name", "pid": _LINKS_PID, "args": {"name": "links"}})
    for (u, v), timeline in busiest[:max_counters]:
        for t, frac in timeline:
            events.append({"ph": "C", "name": f"{u}->{v}", "pid": _LINKS_PID, "ts": t * _US,
                           "args": {"utilization": frac}})


def write_trace(path: str | Path, trace: dict) -> Path:

    return atomic_write_text(path, json.dumps(trace))
