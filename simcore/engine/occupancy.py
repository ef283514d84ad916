"""Link utilization of collectives that skipped the flow solver (analytic occupancy).

A collective that takes its idle-fabric cost never puts flows on the network, yet it occupies
links. Its bytes per link are those of the same collective run alone on an idle copy of the
network (:func:`simcore.collectives.flows.run_collective`, memoized per collective, size and
communicator), spread evenly over the interval it occupied: utilization ``bytes / (duration x
capacity)``. :func:`merge` adds these to the flow solver's own piecewise-constant timelines.
"""

from __future__ import annotations

import weakref

import simpy

from simcore.collectives.flows import run_collective
from simcore.network.flownet import FlowNetwork

__all__ = ["analytic_timelines", "merge"]


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> {call: link bytes}


def _link_bytes(graph, collective: str, size_bytes: float, ranks: tuple[str, ...], seed: int,
                constants) -> tuple[tuple[tuple[str, str], float], ...]:
    cache = _CACHE.setdefault(graph, {})
    key = (collective, size_bytes, ranks, seed, constants)
    if key not in cache:

        env = simpy.Environment()
        net = FlowNetwork(env, graph, seed=seed)
        kwargs = {} if constants is None else {"constants": constants}
        proc = run_collective(env, net, collective, size_bytes, list(ranks), **kwargs)
        env.run(until=proc)
        cache[key] = tuple(net.link_bytes.items())
    return cache[key]


def analytic_timelines(graph, records, seed: int = 0, constants=None) -> dict[tuple[str, str], list]:
    """Per link, ``(start_s, end_s, utilization)`` spans of the analytic ``records``
    (``(ranks, collective, size_bytes, start_s, end_s)``)."""
    spans: dict[tuple[str, str], list] = {}
    for ranks, collective, size, start, end in records:
        if end <= start or size <= 0 or len(ranks) <= 1:
            continue
        for link, nbytes in _link_bytes(graph, collective, float(size), tuple(ranks), seed, constants):
            cap = graph.edges[link]["bandwidth_bytes_per_s"]
            spans.setdefault(link, []).append((start, end, min(nbytes / ((end - start) * cap), 1.0)))
    return spans


def merge(timelines: dict, spans: dict) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Flow-solver timelines (``(time_s, utilization)`` steps) plus analytic spans, as steps."""
    out = {}
    for link in set(timelines) | set(spans):
        deltas: dict[float, float] = {}
        prev = 0.0
        for t, u in timelines.get(link, []):
            deltas[t] = deltas.get(t, 0.0) + u - prev
            prev = u
        for a, b, u in spans.get(link, []):
            deltas[a] = deltas.get(a, 0.0) + u
            deltas[b] = deltas.get(b, 0.0) - u
        level, steps = 0.0, []
        for t in sorted(deltas):
            level += deltas[t]
            steps.append((t, max(level, 0.0)))
        out[link] = steps
    return out
