"""Why the simulator's step differs from the proxy's, read from the simulator's own breakdown.

Both sides split one step into parts that sum to their step time: the proxy, for its critical stage
(the slowest), into ``compute``, communication (``comm:*``) and ``bubble``; the simulator, for the
same stage, into ``compute``, ``exposed_comm``, ``bubble`` and ``idle``. The difference of the two
steps is therefore exactly

    d_compute + d_comm + d_wait,   d_comm = exposed_comm - comm,   d_wait = bubble + idle - bubble_proxy

and the largest term names the cause: overlap hiding communication (``d_comm < 0``), link sharing
exposing more of it (``d_comm > 0``), pipeline stages waiting longer or shorter than the closed form
(``d_wait``), or different compute (``d_compute``: above 0, hot expert ranks under skewed routing;
below 0, a decode step's first kernels already running under the previous step's last collectives,
before the period the simulator measures begins, so that compute is overlap across steps).
:func:`critical_split` picks the simulator's own critical stage when the proxy's is not known.
:func:`overlap_contention_why` separates overlap from contention when the step was also simulated
with contention off (shared with :mod:`validation.studies.fidelity.contention_report`).
"""

from __future__ import annotations

__all__ = ["CAUSES", "critical_split", "deltas", "dominant_cause", "explain", "overlap_contention_why"]

CAUSES = ("overlap", "contention", "pipeline_wait", "pipeline_overlap", "compute_slower", "compute_faster")
_SHARE = 0.2  # a term is named when it is at least this share of the largest term


def critical_split(split: list[dict[str, float]]) -> dict[str, float]:
    """The critical stage's split: the stage with the most compute plus exposed communication."""
    if not split:
        return {"compute": 0.0, "exposed_comm": 0.0, "bubble": 0.0, "idle": 0.0}
    return max(split, key=lambda d: d["compute"] + d["exposed_comm"])


def deltas(proxy_category: dict[str, float], sim_split: dict[str, float]) -> dict[str, float]:
    """Simulator minus proxy per part, seconds: ``compute``, ``comm`` (exposed vs all), ``wait``."""
    comm = sum(v for k, v in proxy_category.items() if k.startswith("comm"))
    return {"compute": sim_split["compute"] - proxy_category.get("compute", 0.0),
            "comm": sim_split["exposed_comm"] - comm,
            "wait": sim_split["bubble"] + sim_split["idle"] - proxy_category.get("bubble", 0.0)}


def _cause(part: str, value: float) -> str:
    return {("comm", False): "overlap", ("comm", True): "contention", ("wait", True): "pipeline_wait",
            ("wait", False): "pipeline_overlap", ("compute", True): "compute_slower",
            ("compute", False): "compute_faster"}[(part, value > 0)]


def dominant_cause(d: dict[str, float]) -> str:
    """The cause of the largest term of :func:`deltas`."""
    part = max(d, key=lambda k: abs(d[k]))
    return _cause(part, d[part])


def explain(proxy_category: dict[str, float], sim_split: dict[str, float], max_link_utilization: float) -> str:
    """One sentence: the terms of :func:`deltas` that matter, largest first, in milliseconds."""
    d = deltas(proxy_category, sim_split)
    comm = sum(v for k, v in proxy_category.items() if k.startswith("comm"))
    largest = max(abs(v) for v in d.values())
    parts = []
    for part in sorted(d, key=lambda k: -abs(d[k])):
        v, ms = d[part], abs(d[part]) * 1e3
        if largest == 0 or abs(v) < _SHARE * largest:
            continue
        cause = _cause(part, v)
        parts.append({
            "overlap": f"overlap hides {ms:.3g} ms of the proxy's {comm * 1e3:.3g} ms of communication",
            "contention": f"link sharing exposes {ms:.3g} ms more communication than the proxy's "
                          f"{comm * 1e3:.3g} ms (busiest link {max_link_utilization:.0%} busy on average)",
            "pipeline_wait": f"the critical stage waits {ms:.3g} ms longer (bubble + idle "
                             f"{(sim_split['bubble'] + sim_split['idle']) * 1e3:.3g} ms vs the proxy's bubble "
                             f"{proxy_category.get('bubble', 0.0) * 1e3:.3g} ms)",
            "pipeline_overlap": f"the critical stage waits {ms:.3g} ms less than the proxy's closed-form bubble "
                                f"({proxy_category.get('bubble', 0.0) * 1e3:.3g} ms)",
            "compute_slower": f"compute takes {ms:.3g} ms longer (hot expert ranks under skewed routing)",
            "compute_faster": f"{ms:.3g} ms of the step's compute runs under the previous decode step's tail, "
                              f"before the measured period starts",
        }[cause])
    return "; ".join(parts) or "no difference"


def overlap_contention_why(overlap_ratio: float, full_ratio: float) -> str:
    """Split a sim/proxy step ratio into what overlap saves or costs (``overlap_ratio``: contention
    off) and what link sharing adds on top (``full_ratio``: both on)."""
    parts = []
    if overlap_ratio < 0.995:
        parts.append(f"overlap hides {1 - overlap_ratio:.1%} (collectives under other kernels: another "
                     f"microbatch's, or the shared experts beside an MoE dispatch)")
    elif overlap_ratio > 1.005:
        parts.append(f"overlap costs {overlap_ratio - 1:.1%} (a later microbatch's collective holds the "
                     f"communication stream when the critical microbatch needs it)")
    if full_ratio > overlap_ratio * 1.005:
        parts.append(f"link sharing adds {full_ratio / overlap_ratio - 1:.1%} (pipeline sends and collectives "
                     f"of neighbouring stages on the same NVLink/NIC links)")
    elif full_ratio < overlap_ratio * 0.995:
        parts.append(f"the collectives as flows finish {1 - full_ratio / overlap_ratio:.1%} sooner than their "
                     f"idle-fabric costs")
    return "; ".join(parts) or "no difference: every collective runs alone on its links"
