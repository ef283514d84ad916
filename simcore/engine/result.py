"""What a simulated step reports: times, throughput, and where each GPU's time went."""

from __future__ import annotations

from dataclasses import dataclass, field

from simcore.engine.executor import Interval

__all__ = ["SimResult", "time_split"]


@dataclass
class SimResult:
    """A simulated step. ``split[stage]`` breaks one step on each GPU of that stage into compute,
    exposed communication, bubble (waiting between its first and last op) and idle (before the
    first or after the last op) and host (what the host's time per step adds beyond the GPUs',
    :mod:`simcore.cost.host`); the five sum to ``step_time_s``."""

    strategy: object
    valid: bool
    reasons: list[str]
    step_time_s: float = float("nan")
    ttft_s: float = float("nan")
    tpot_s: float = float("nan")
    tokens_per_s: float = 0.0
    tokens_per_s_per_gpu: float = 0.0
    split: list[dict[str, float]] = field(default_factory=list)
    stage_gpus: list[list[str]] = field(default_factory=list)
    link_utilization: dict[str, float] = field(default_factory=dict)
    proxy_step_time_s: float = float("nan")
    proxy_tokens_per_s_per_gpu: float = float("nan")
    wall_s: float = 0.0
    network_events: int = 0
    flows_run: int = 0  # per-gpu: collectives that ran on the flow solver
    mode: str = ""  # folded | per-gpu: what ran
    mode_reason: str = ""  # why (``sim.mode=auto`` folds only where that is exact)
    lanes: int = 0  # processes per (microbatch, step): stages when folded, GPUs or proven orbits per-gpu
    trace: dict | None = None

    def per_gpu_split(self) -> dict[str, dict[str, float]]:
        return {gpu: self.split[p] for p, gpus in enumerate(self.stage_gpus) for gpu in gpus}

    def to_dict(self) -> dict:
        return {"strategy": self.strategy.to_dict(), "valid": self.valid, "reasons": self.reasons,
                "step_time_s": self.step_time_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "split_by_stage": self.split, "link_utilization": self.link_utilization,
                "proxy_step_time_s": self.proxy_step_time_s,
                "proxy_tokens_per_s_per_gpu": self.proxy_tokens_per_s_per_gpu,
                "wall_s": self.wall_s, "network_events": self.network_events, "flows_run": self.flows_run,
                "mode": self.mode, "mode_reason": self.mode_reason, "lanes": self.lanes}


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(spans) -> float:
    return sum(b - a for a, b in spans)


def _intersect(xs, ys) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def time_split(intervals: list[Interval], stage: int, start: float, end: float, periods: int = 1) -> dict:
    """Compute / exposed comm / bubble / idle of one stage inside ``[start, end]``, per period."""
    def clip(stream):
        return _union([(max(i.start, start), min(i.end, end)) for i in intervals
                       if i.stage == stage and i.stream == stream and i.end > start and i.start < end])

    compute = clip("compute")
    comm = clip("comm")
    busy = _union(compute + comm)
    c = _length(compute)
    exposed = _length(comm) - _intersect(compute, comm)
    window = end - start
    active = (busy[-1][1] - busy[0][0]) if busy else 0.0
    bubble = active - _length(busy)
    idle = window - active
    return {k: v / periods for k, v in
            {"compute": c, "exposed_comm": exposed, "bubble": bubble, "idle": idle}.items()}
