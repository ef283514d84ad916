"""A row's simulated run re-timed under other host constants, without simulating it again.

The runtime's host time per step (``RuntimeProfile.step_host_s`` plus ``step_host_per_seq_s`` per sequence
of the busiest attention group, :func:`simcore.serving.worker.step_host_s`) only moves steps in time: it
runs before its step's GPU work (a synchronous runtime) or beside the previous step's (an overlapping one).
Which requests a step runs is decided by the schedulers (queues, KV cache, token budgets, TensorRT-LLM's
batch waiting and attention-DP balancing, all counted in steps), never by a clock; and with no request
path (``request_s`` 0) one worker's closed-loop clients send each next request the moment one ends, at a
step's end, where the next step is formed. So, for an aggregated row on one worker with one pipeline
stage, the sequence of steps is the same whatever the host constants, and each step's GPU time too; only
their times move:

- synchronous: step ``k`` starts ``h_k`` after step ``k-1`` ends: ``E_k = sum_{j<=k} (h_j + t_j)``;
- overlapping: step ``k`` starts when step ``k-1`` ends and its own host work (begun when step ``k-1``
  started) is done: ``S_k = sum_{j<k} max(t_j, h_j)``, ``E_k = S_k + t_k``

(``t_k`` the step's GPU time, ``h_k`` its host time), which is :class:`simcore.serving.worker.Worker`'s
rule step by step. :func:`record` simulates a row once with no host time and no request path, through
the simulator's trace hook, and keeps ``t_k``, the sequences of each step's busiest group, and, per
request, the steps it was sent after, got its first token at and ended at. :func:`retime` gives the run's
mean TTFT and TPOT under any ``step_host_s`` and ``step_host_per_seq_s`` from those alone: the very
numbers a simulation with them (and ``request_s`` 0) gives, to rounding
(``tests/test_serving_cross_validation.py`` compares the two). A row it cannot replay (disaggregated,
several workers or stages, a launch that sets host time itself) raises :class:`NotReplayable`.

What it is for: the host fit (:mod:`.fit`) and its leave-one-group-out check (:mod:`.cross_validate`)
score hundreds of host constants on every row; each row is simulated once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simcore.serving import simulate_serving

__all__ = ["NotReplayable", "Recording", "record", "record_rows", "retime", "request_path_s", "HOST_FIELDS"]

#: the runtime-profile fields a recording is re-timed under (the rest are the recording's own)
HOST_FIELDS = ("step_host_s", "step_host_per_seq_s", "request_s", "tokenize_s_per_token")
_ARRAYS = ("gpu_s", "seqs", "sent", "first", "finish", "tokens", "prompt")


class NotReplayable(ValueError):
    """A row whose steps could depend on its host constants, or that could not be simulated: why, in one line."""


@dataclass(frozen=True)
class Recording:
    """One simulated run's steps and requests (module doc). Per step: ``gpu_s`` its GPU time, ``seqs`` the
    sequences its busiest attention group ran; per measured request: ``sent`` the step at whose end it was
    sent (-1: at the start), ``first`` and ``finish`` the steps that emitted its first and last token,
    ``tokens`` its output length, ``prompt`` its prompt's; ``overlap``: whether the host overlaps the GPU."""

    gpu_s: np.ndarray
    seqs: np.ndarray
    sent: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    tokens: np.ndarray
    prompt: np.ndarray
    overlap: bool

    def save(self, path: Path) -> None:
        """Write it as ``.npz`` (numbers only: :meth:`load` reads no pickled object)."""
        with open(path, "wb") as handle:
            np.savez(handle, overlap=np.array(self.overlap), **{k: getattr(self, k) for k in _ARRAYS})

    @classmethod
    def load(cls, path: Path) -> Recording:
        with np.load(path, allow_pickle=False) as data:
            return cls(**{k: data[k] for k in _ARRAYS}, overlap=bool(data["overlap"]))


def retime(rec: Recording, step_host_s: float, step_host_per_seq_s: float) -> tuple[float, float]:
    """Mean TTFT and TPOT in seconds of the recorded run with host time ``step_host_s + step_host_per_seq_s x
    seqs`` per step (module doc); nan where no request counts."""
    host = step_host_s + step_host_per_seq_s * rec.seqs
    if rec.overlap:
        start = np.concatenate(([0.0], np.cumsum(np.maximum(rec.gpu_s, host))[:-1]))
        end = start + rec.gpu_s
    else:
        end = np.cumsum(host + rec.gpu_s)
    sent = np.where(rec.sent >= 0, end[np.maximum(rec.sent, 0)], 0.0)
    ttft = end[rec.first] - sent
    many = rec.tokens > 1
    tpot = (end[rec.finish[many]] - end[rec.first[many]]) / (rec.tokens[many] - 1)
    return (float(ttft.mean()) if ttft.size else math.nan, float(tpot.mean()) if tpot.size else math.nan)


def request_path_s(rec: Recording, request_s: float, tokenize_s_per_token: float) -> float:
    """The mean request path over the recorded requests (:meth:`RuntimeProfile.request_path_s`: the fixed
    latency plus the tokenization of each prompt), as the fit adds it to a re-timed TTFT (:mod:`.fit`)."""
    return request_s + tokenize_s_per_token * (float(rec.prompt.mean()) if rec.prompt.size else 0.0)


class _Recorder:
    """The simulator's trace hook (``simulate_serving(trace=...)``), keeping what :func:`retime` needs."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float, int, tuple | None]] = []  # start, end, seqs, folded run
        self.done: list = []
        self.runtime = None

    def bind(self, num_requests: int, pools: dict) -> None:
        workers = [w for ws in pools.values() for w in ws]
        if len(workers) != 1 or workers[0].cost.strategy.pp != 1:
            raise NotReplayable(f"{len(workers)} workers of {workers[0].cost.strategy.pp} pipeline stages: their "
                                "steps' order can depend on the host time")
        self.runtime = workers[0].runtime

    def step(self, worker, picks, start_s: float, end_s: float, steps: int = 1, stages=None) -> None:
        seqs = max((len(p) for p in picks), default=0)
        if steps == 1:
            self.steps.append((start_s, end_s, seqs, None))
            return
        ref = next(r for p in picks for r, _ in p)  # every request of a folded run emits a token per step
        self.steps.append((start_s, end_s, seqs, (ref, len(ref.token_times), steps)))

    def finished(self, req) -> None:
        self.done.append(req)

    def arrived(self, req, t: float) -> None:
        pass

    def counters(self, worker, t: float) -> None:
        pass

    def hand_off(self, req, t: float) -> None:
        raise NotReplayable("a KV hand-off: disaggregated runs are not replayed")

    handed = links = hand_off

    def recording(self, warmup: int) -> Recording:
        """The run as :func:`retime` reads it; :class:`NotReplayable` where its steps were not back to back."""
        ends, seqs, starts = [], [], []
        for start, end, n, folded in self.steps:
            if folded is None:
                ends.append(end)
            else:  # a folded run of pure decodes: its steps' ends are its requests' token times
                ref, at, steps = folded
                ends += ref.token_times[at:at + steps]
            count = len(ends) - len(seqs)
            seqs += [n] * count
            starts += [start] + [math.nan] * (count - 1)
        ends = np.asarray(ends, dtype=float)
        tol = 1e-9 * max(float(ends[-1]) if ends.size else 1.0, 1.0)
        gaps = np.abs(np.asarray(starts) - np.concatenate(([0.0], ends[:-1])))
        if np.nanmax(gaps, initial=0.0) > tol:  # no host time, no request path: a gap is a wait on something else
            raise NotReplayable("the worker waited between steps: its steps' times depend on more than the host")

        def step_of(times) -> np.ndarray:
            times = np.asarray(times, dtype=float)
            idx = np.clip(np.searchsorted(ends, times - tol), 0, len(ends) - 1)
            if np.any(np.abs(ends[idx] - times) > tol):
                raise NotReplayable("a request's time is no step's end")
            return idx

        reqs = [r for r in self.done if r.rid >= warmup]
        arrival = np.asarray([r.arrival_s for r in reqs], dtype=float)
        sent = np.where(arrival > tol, step_of(np.where(arrival > tol, arrival, ends[0])), -1)
        return Recording(gpu_s=np.diff(np.concatenate(([0.0], ends))), seqs=np.asarray(seqs, dtype=float),
                         sent=sent, first=step_of([r.first_token_s for r in reqs]),
                         finish=step_of([r.finish_s for r in reqs]),
                         tokens=np.asarray([r.output_len for r in reqs], dtype=float),
                         prompt=np.asarray([r.input_len for r in reqs], dtype=float),
                         overlap=bool(self.runtime.overlap_host))


def record(case, runtime=None) -> Recording:
    """Simulate a mapped row (:class:`~.mapping.RowCase`) once under ``runtime`` (its backend's profile by
    default, the harness's launch flags on top) with no host time and no request path, and keep its steps
    (module doc); :class:`NotReplayable` says why a row cannot be."""
    from validation.studies.serving import case_runtime, serving_config

    if case.skip:
        raise NotReplayable(case.skip)
    if case.plan.mode != "agg":
        raise NotReplayable(f"a {case.plan.mode} row: its pools' steps interleave in time")
    if set(HOST_FIELDS) & set(case.launch):
        raise NotReplayable(f"its launch sets {', '.join(sorted(set(HOST_FIELDS) & set(case.launch)))}")
    zero = dict.fromkeys(HOST_FIELDS, 0.0)
    rt = case_runtime(case, runtime).with_overrides(**zero)
    recorder = _Recorder()
    cfg = serving_config(case)
    result = simulate_serving(case.ctx, case.plan, cfg, runtime=rt, trace=recorder)
    if not result.feasible:
        raise NotReplayable(result.reason)
    if any(getattr(recorder.runtime, f) for f in HOST_FIELDS):
        raise NotReplayable("the deployment set host time of its own")
    return recorder.recording(cfg.warmup)


def _record_row(args) -> tuple[float, float, str]:
    """A worker's :func:`record` of one CSV row (rows pickle, mapped cases need not), saved to ``path``:
    the recording's TTFT and TPOT with no host time, or nan and why it is not replayable."""
    from simcore.serving import get_runtime
    from validation.studies.serving.mapping import map_row

    row, overrides, path = args
    case = map_row(row)
    try:
        rec = record(case, get_runtime(case.runtime).with_overrides(**overrides) if overrides and not case.skip
                     else None)
    except NotReplayable as exc:
        return math.nan, math.nan, str(exc).splitlines()[0] or "not replayable"
    part = Path(path).with_suffix(".part")
    rec.save(part)
    part.replace(path)  # whole or absent: a kill mid-write leaves no half recording under the name
    ttft, tpot = retime(rec, 0.0, 0.0)
    return ttft, tpot, ""


def record_rows(cases: list, jobs: int | None, store: Path, stamp: str, overrides: dict | None = None) -> list:
    """:func:`record` of every case under its backend's profile with ``overrides`` (runtime-profile fields
    besides the host's), in ``jobs`` processes: per case its :class:`Recording` or why not (a string).
    Journaled in ``store`` (:func:`.journal.simulate_rows`, fingerprint ``stamp``; each recording a ``.npz``
    beside it): the same call again reads back what it recorded instead of simulating it."""
    import hashlib
    import json

    from validation.studies.serving.journal import simulate_rows
    from validation.studies.serving.measurement import measurement_key

    tag = json.dumps(overrides or {}, sort_keys=True)
    keys = [f"{measurement_key(c.row)!r} {tag}" for c in cases]
    paths = [store / f"{hashlib.sha256(k.encode()).hexdigest()[:24]}.npz" for k in keys]
    store.mkdir(parents=True, exist_ok=True)
    results = simulate_rows([(c.row, overrides or {}, str(p)) for c, p in zip(cases, paths, strict=True)], keys,
                            _record_row, jobs, store, stamp)
    out = []
    for (_ttft, _tpot, why), path, case in zip(results, paths, cases, strict=True):
        if why:
            out.append(why)
            continue
        if not path.exists():  # journaled, its file lost: record it again here
            _record_row((case.row, overrides or {}, str(path)))
        out.append(Recording.load(path))
    return out
