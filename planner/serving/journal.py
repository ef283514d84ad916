"""The serving search's journal: every simulation it ran, appended as it finishes, so none is lost.

A serving search spends its time in :func:`simcore.serving.simulate_serving` (seconds per plan), so
what must survive an interrupt is the simulations, not the method's state. The journal
(``serving_sims.pkl`` in the run dir) is a stream of pickles: a header with the run's config, then one
``(key, result)`` record per simulation, each flushed and synced before the search goes on; a record
cut short by a crash is dropped on load.

``shard-search workload=serving +resume=RUN_DIR`` runs the same method with the same seed again and
answers each plan it reaches from the journal instead of simulating it, counting it against the
budget as the first run did. Simulations and methods are deterministic (seeded), so the resumed run
proposes exactly what the interrupted one did and, past the journal's end, goes on as it would have:
its outputs equal an uninterrupted run's (``tests/test_serving_journal.py`` holds this). A journal
made with another config is refused, naming the first setting that differs.

A journal is read back through :mod:`planner.safe_pickle`: its records may construct plain data and
the classes of a simulation's result (:data:`RESULT_CLASSES`), nothing else, so a crafted file is
refused, naming what it asked for, instead of running it.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from planner import safe_pickle
from planner.checkpoint import config_difference
from planner.errors import UserError

__all__ = ["JOURNAL_NAME", "RESULT_CLASSES", "SimJournal"]

JOURNAL_NAME = "serving_sims.pkl"
_VERSION = 1
_RESULT = "simcore.serving.simulate.ServingResult"

#: the project's classes a journal record holds: a :class:`~simcore.serving.ServingResult` and its parts
RESULT_CLASSES = frozenset({_RESULT, "simcore.serving.plan.ServingPlan", "simcore.serving.plan.Pool",
                            "simcore.strategy.sharding.Strategy", "simcore.serving.metrics.ServingMetrics"})
_ALLOWED = safe_pickle.DATA | RESULT_CLASSES


def _qualname(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class SimJournal:
    """Append-only record of a serving search's simulations (module doc); ``get`` answers a plan key
    from a resumed journal, ``add`` appends a new simulation."""

    def __init__(self, run_dir: str | os.PathLike, config: dict, resume: bool = False) -> None:
        self.path = Path(run_dir) / JOURNAL_NAME
        self.stored: dict[tuple[int, ...], object] = {}
        if resume:
            self._load(config)
        elif self.path.exists():
            raise UserError(f"resume: {self.path} exists; continue it with +resume={self.path.parent}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        self._fh = self.path.open("ab")
        if fresh:
            self._append({"version": _VERSION, "config": config})

    def _load(self, config: dict) -> None:
        if not self.path.is_file():
            raise UserError(f"resume: no {JOURNAL_NAME} in {self.path.parent}")
        with self.path.open("rb") as fh:
            header = self._header(fh)
            diff = config_difference(header["config"], config)
            if diff:
                raise UserError(f"resume: the journal was made with another config ({diff})")
            good = fh.tell()  # bytes of whole records: a torn last record is cut off before appending
            while (record := self._record(fh)) is not None:
                key, result = record
                self.stored[key] = result
                good = fh.tell()
        with self.path.open("r+b") as fh:
            fh.truncate(good)

    def _header(self, fh) -> dict:
        try:
            header = safe_pickle.load(fh, safe_pickle.DATA)
        except safe_pickle.RefusedPickle as exc:
            raise UserError(f"resume: {self.path}: {exc}") from None
        except (pickle.UnpicklingError, EOFError) as exc:
            raise UserError(f"resume: {self.path} is not a readable journal ({exc})") from None
        if not isinstance(header, dict) or header.get("version") != _VERSION:
            raise UserError(f"resume: {self.path} was written by another version of shard-search")
        if not isinstance(header.get("config"), dict):
            raise UserError(f"resume: {self.path} has no 'config'" if "config" not in header else
                            f"resume: {self.path}: its 'config' is not a dict")
        return header

    def _record(self, fh) -> tuple[tuple[int, ...], object] | None:
        """The next ``(key, result)`` record, or ``None`` at the end or at a record cut short by a
        crash (nothing after it is kept); a record asking for a foreign class, or one that is not a
        plan key and a simulation result, is refused."""
        try:
            record = safe_pickle.load(fh, _ALLOWED)
        except safe_pickle.RefusedPickle as exc:
            raise UserError(f"resume: {self.path}: {exc}") from None
        except (EOFError, pickle.UnpicklingError):
            return None
        if (not isinstance(record, tuple) or len(record) != 2 or not isinstance(record[0], tuple)
                or not all(isinstance(k, int) and not isinstance(k, bool) for k in record[0])
                or _qualname(record[1]) != _RESULT):
            raise UserError(f"resume: {self.path}: a record is not a (plan key, {_RESULT}) pair")
        return record

    def _append(self, obj) -> None:
        pickle.dump(obj, self._fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def get(self, key: tuple[int, ...]):
        """The stored result of plan ``key`` (``None`` if this journal has not simulated it)."""
        return self.stored.get(tuple(key))

    def add(self, key: tuple[int, ...], result) -> None:
        self._append((tuple(int(k) for k in key), result))

    def close(self) -> None:
        self._fh.close()
