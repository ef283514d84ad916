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
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from planner.checkpoint import config_difference
from planner.errors import UserError

__all__ = ["JOURNAL_NAME", "SimJournal"]

JOURNAL_NAME = "serving_sims.pkl"
_VERSION = 1


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
        good = 0  # bytes of whole records: a torn last record is cut off before appending
        with self.path.open("rb") as fh:
            try:
                header = pickle.load(fh)
            except (pickle.UnpicklingError, EOFError) as exc:
                raise UserError(f"resume: {self.path} is not a readable journal ({exc})") from None
            if not isinstance(header, dict) or header.get("version") != _VERSION:
                raise UserError(f"resume: {self.path} was written by another version of shard-search")
            diff = config_difference(header["config"], config)
            if diff:
                raise UserError(f"resume: the journal was made with another config ({diff})")
            good = fh.tell()
            while True:
                try:
                    key, result = pickle.load(fh)
                except (EOFError, pickle.UnpicklingError, ValueError, TypeError):
                    break
                self.stored[tuple(key)] = result
                good = fh.tell()
        with self.path.open("r+b") as fh:
            fh.truncate(good)

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
