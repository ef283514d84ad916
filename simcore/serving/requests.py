"""Requests and where they come from: closed-loop clients, a Poisson process, or a trace CSV.

A :class:`Request` carries its own timestamps (arrival, first token, each further token, finish), so
every latency metric is computed from the same record. Lengths are fixed or drawn from a
distribution (:class:`LengthDist`); all draws go through one seeded ``numpy`` generator, so a run is
reproducible bit for bit.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Request", "LengthDist", "ServingInputError", "read_trace", "TRACE_COLUMNS", "LENGTH_KINDS"]

TRACE_COLUMNS = ("arrival_s", "input_len", "output_len")
LENGTH_KINDS = ("fixed", "uniform", "normal", "lognormal")


class ServingInputError(ValueError):
    """Bad serving input (a config field, a trace file); the message names the field."""


@dataclass(eq=False)
class Request:
    """One request; times in seconds of simulated time, ``nan`` until they happen. A request is equal
    only to itself (the schedulers' ``in`` and ``remove`` on their queues compare by identity, not
    field by field)."""

    rid: int
    arrival_s: float
    input_len: int
    output_len: int
    client: int = -1
    kv_tokens: int = 0  # tokens whose KV is computed and held
    prefill_target: int = 0  # tokens to prefill before the next sample (prompt, or all known after preemption)
    generated: int = 0  # output tokens produced (the first comes with the end of the prefill)
    first_token_s: float = math.nan
    finish_s: float = math.nan
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    group: int = 0  # attention data-parallel group it runs on
    handoff_s: float = math.nan  # disaggregated: when its KV cache reached the decode worker
    held_first: bool = False  # disaggregated: its first token waits for the decode worker (hold_first)
    spec_credit: float = 0.0  # speculative decoding: the fraction of a token carried to its next step

    def __post_init__(self) -> None:
        if self.prefill_target == 0:
            self.prefill_target = self.input_len

    @property
    def in_prefill(self) -> bool:
        return self.kv_tokens < self.prefill_target

    @property
    def remaining_prefill(self) -> int:
        return self.prefill_target - self.kv_tokens

    @property
    def done(self) -> bool:
        return self.generated >= self.output_len

    def advance(self, new_tokens: int, now: float, emit: int = 1) -> bool:
        """Apply a step that computed ``new_tokens`` tokens of this request and, once its prompt is in,
        emits ``emit`` tokens (more than one: accepted speculative drafts); True if it emitted any."""
        self.kv_tokens += new_tokens
        if self.kv_tokens < self.prefill_target:
            return False
        self.generated += emit
        self.release_first(now)
        self.token_times.extend([now] * emit)
        if self.generated == 1:
            self.first_token_s = now
        if self.done:
            self.finish_s = now
        return True

    def streamed_at(self, now: float, seen: float, tokens: int) -> None:
        """The ``tokens`` tokens it emitted at ``now`` reach its client at ``seen`` (the server's
        frontend, :mod:`simcore.serving.frontend`)."""
        times = self.token_times
        times[len(times) - tokens:] = [seen] * tokens
        if self.first_token_s == now:
            self.first_token_s = seen
        if self.finish_s == now:
            self.finish_s = seen

    def hold_first(self) -> None:
        """Disaggregated serving: the first token, sampled at the end of the prefill on the prefill
        worker, is not streamed from there; it reaches the client with the decode worker's output, at
        the end of that worker's first step on this request (``simcore.serving.simulate``, hand-off)."""
        self.first_token_s = math.nan
        self.token_times.clear()
        self.held_first = True

    def release_first(self, now: float) -> None:
        """A held first token reaches the client at ``now``, with the token the step emits."""
        if self.held_first:
            self.held_first = False
            self.first_token_s = now
            self.token_times.append(now)

    def reset_for_recompute(self) -> None:
        """Preempted with recompute (vLLM's default, SGLang's retraction): its KV is dropped, and the
        prompt plus every token generated so far is prefilled again when it is rescheduled."""
        self.preemptions += 1
        self.kv_tokens = 0
        self.prefill_target = self.input_len + self.generated


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: ``fixed`` (``mean``), ``uniform`` (``low``..``high``), ``normal``
    (``mean``, ``std``) or ``lognormal`` (``mean``, ``std`` of the length itself); clipped to
    ``[low, high]`` and rounded to whole tokens."""

    kind: str = "fixed"
    mean: float = 1024.0
    std: float = 0.0
    low: int = 1
    high: int = 1 << 20
    name: str = "length"

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ServingInputError(f"{self.name}.kind: {self.kind!r} is not one of {', '.join(LENGTH_KINDS)}")
        if not self.mean >= 1:
            raise ServingInputError(f"{self.name}.mean must be >= 1 token, got {self.mean!r}")
        if self.std < 0:
            raise ServingInputError(f"{self.name}.std must be >= 0, got {self.std!r}")
        if not 1 <= self.low <= self.high:
            raise ServingInputError(f"{self.name}: need 1 <= low <= high, got low={self.low} high={self.high}")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            x = np.full(n, self.mean)
        elif self.kind == "uniform":
            x = rng.uniform(self.low, self.high, n)
        elif self.kind == "normal":
            x = rng.normal(self.mean, self.std, n)
        else:  # lognormal with the given mean and std of the length
            sigma2 = math.log1p((self.std / self.mean) ** 2)
            x = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), n)
        return np.clip(np.rint(x), self.low, self.high).astype(int)


def read_trace(path: str | Path) -> list[tuple[float, int, int]]:
    """Rows ``(arrival_s, input_len, output_len)`` of a trace CSV, sorted by arrival.

    Raises :class:`ServingInputError` naming the file and the bad column or row."""
    path = Path(path)
    if not path.is_file():
        raise ServingInputError(f"serving.trace: file not found: {path}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ServingInputError(f"serving.trace {path.name}: missing column(s) {', '.join(missing)}")
        rows = []
        for i, row in enumerate(reader, start=2):
            try:
                arrival, isl, osl = float(row["arrival_s"]), int(row["input_len"]), int(row["output_len"])
            except (TypeError, ValueError):
                raise ServingInputError(f"serving.trace {path.name} line {i}: arrival_s, input_len, output_len "
                                        f"must be numbers") from None
            for name, value in (("arrival_s", arrival), ("input_len", isl), ("output_len", osl)):
                if not (value >= 0 and math.isfinite(value)) or (name != "arrival_s" and value < 1):
                    raise ServingInputError(f"serving.trace {path.name} line {i}: {name} must be "
                                            f"{'>= 0' if name == 'arrival_s' else 'a positive length'}, got {value}")
            rows.append((arrival, isl, osl))
    if not rows:
        raise ServingInputError(f"serving.trace {path.name}: no requests")
    return sorted(rows)
