"""Chrome / Perfetto trace of a simulated phase (open in ui.perfetto.dev or chrome://tracing).

A process per node, a thread per GPU stream (compute, comm), every process and thread named.
The GPUs of a stage run identical timelines, so each stage is drawn on its first GPU (the thread
name says how many GPUs it stands for). Collectives also appear as async events, and the busiest
links as counter tracks of their utilization.
"""

from __future__ import annotations

import json
from pathlib import Path

from .executor import Interval

__all__ = ["chrome_trace", "write_trace"]

_US = 1e6  # trace timestamps are microseconds


def chrome_trace(intervals: list[Interval], stage_gpus: list[list[str]], graph,
                 utilization: dict | None = None, max_counters: int = 16) -> dict:
    """Build the trace dict (``traceEvents`` plus metadata)."""
    events: list[dict] = []
    named_pids: set[int] = set()
    tids: dict[tuple[int, str], tuple[int, int]] = {}
    for stage, gpus in enumerate(stage_gpus):
        gpu = gpus[0]
        node = int(graph.nodes[gpu].get("node", 0))
        local = int(graph.nodes[gpu].get("local", 0))
        if node not in named_pids:
            named_pids.add(node)
            events.append({"ph": "M", "name": "process_name", "pid": node, "args": {"name": f"node {node}"}})
        for k, stream in enumerate(("compute", "comm")):
            tid = local * 2 + k
            tids[(stage, stream)] = (node, tid)
            label = f"{gpu} {stream} (stage {stage}, stands for {len(gpus)} GPUs)"
            events.append({"ph": "M", "name": "thread_name", "pid": node, "tid": tid, "args": {"name": label}})
    for n, iv in enumerate(intervals):
        pid, tid = tids[(iv.stage, iv.stream)]
        args = {"op": iv.op, "layer": iv.layer, "microbatch": iv.microbatch, "step": iv.step}
        events.append({"ph": "X", "name": iv.name, "cat": iv.stream, "pid": pid, "tid": tid,
                       "ts": iv.start * _US, "dur": (iv.end - iv.start) * _US, "args": args})
        if iv.stream == "comm":
            for ph, ts in (("b", iv.start), ("e", iv.end)):
                events.append({"ph": ph, "name": iv.name, "cat": "collective", "id": n, "pid": pid,
                               "tid": tid, "ts": ts * _US})
    if utilization:
        busiest = sorted(utilization.items(), key=lambda kv: -max((u for _, u in kv[1]), default=0.0))
        events.append({"ph": "M", "name": "process_name", "pid": 100_000, "args": {"name": "links"}})
        for (u, v), timeline in busiest[:max_counters]:
            for t, frac in timeline:
                events.append({"ph": "C", "name": f"{u}->{v}", "pid": 100_000, "ts": t * _US,
                               "args": {"utilization": frac}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, trace: dict) -> Path:
    from ..apps.common import atomic_write_text

    return atomic_write_text(path, json.dumps(trace))
