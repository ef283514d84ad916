"""The serving study's journal: each simulated row's answer is appended as it ends, so nothing computed is lost.

The whole sample takes about half an hour on two cores. ``rows.jsonl`` in the run dir holds a header line
with the run's fingerprint, then one line per simulated measurement: its key
(:func:`~validation.studies.serving.measurement_key`) and the simulated TTFT, TPOT (seconds; ``null`` for
a row that could not be simulated) and the reason it could not. A line is written and flushed as its row
ends; a line cut short by a kill is ignored when read back.

Run the study again in the same run dir (``shard-validate study=serving hydra.run.dir=DIR``) and the rows
the journal holds are read back instead of simulated, but only under the same fingerprint: a hash of the
data file and of every file that prices a row (``simcore/`` with its shipped model configs, ``validation/studies/serving/``
and ``validation/studies/common/split.py``), so a changed constant, mapping or cost formula never reuses an old answer. A
journal of another fingerprint is set aside (renamed ``rows.jsonl.stale``) and the study starts over.
The journal is data only (JSON lines, read as numbers and strings, nothing constructed from it): a
``rows.jsonl`` that is not one (not UTF-8 text, or its first line is no fingerprint header) is refused
with one line naming it, never read as rows or overwritten.

SIGINT and SIGTERM stop the study between two rows (:class:`StudyInterrupted`): the rows that ended are
in the journal; workers ignore SIGINT, so the simulations in flight end and are kept too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
from collections.abc import Callable
from pathlib import Path

from planner.errors import UserError

__all__ = ["RowJournal", "StudyInterrupted", "fingerprint", "simulate_rows"]

_VALIDATION = Path(__file__).resolve().parents[2]


def _sources() -> list[tuple[str, Path]]:
    """What prices a row: every file of ``simcore`` (wherever it is installed: its modules and the
    ``config.json`` presets of ``simcore/models/configs``), of this study's package and
    the train/test split (``validation/studies/common/split.py``), each with the name it enters the hash under."""
    import simcore
    from validation.studies.common import split

    trees = [("simcore", Path(simcore.__file__).resolve().parent), ("validation/studies/serving", Path(__file__).resolve().parent)]
    files = [(f"{name}/{f.relative_to(base)}", f) for name, base in trees for f in sorted(base.rglob("*"))
             if f.is_file() and "__pycache__" not in f.parts]  # the modules and the shipped model configs
    split_file = Path(split.__file__).resolve()
    return files + [(f"validation/{split_file.relative_to(_VALIDATION).as_posix()}", split_file)]


class StudyInterrupted(Exception):
    """The study stopped on request; ``done`` of ``total`` simulations are in the journal at ``path``."""

    def __init__(self, done: int, total: int, path: Path, signum: int | None):
        super().__init__(f"interrupted after {done} of {total} simulations")
        self.done, self.total, self.path, self.signal = done, total, path, signum


def fingerprint(data: Path) -> str:
    """A hash of the data file's bytes and of the source files that price a row (module doc)."""
    h = hashlib.sha256(Path(data).read_bytes())
    for name, path in _sources():
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _number(value) -> float:
    return math.nan if value is None else float(value)


class RowJournal:
    """``rows.jsonl`` of one run dir: :attr:`results` maps a key to ``(ttft_s, tpot_s, reason)`` for every
    row already simulated under ``stamp`` (module doc); :meth:`append` adds one as it ends."""

    NAME = "rows.jsonl"

    def __init__(self, out: Path, stamp: str):
        self.path = Path(out) / self.NAME
        self.stamp = stamp
        self.results: dict[str, tuple[float, float, str]] = {}
        self.reused = 0
        if self.path.exists():
            self._read()
        if not self.results:  # a new journal, or one set aside: write the header
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("w") as f:
                f.write(json.dumps({"fingerprint": stamp}) + "\n")
        self.reused = len(self.results)
        self._file = self.path.open("a")

    def _read(self) -> None:
        try:
            lines = self.path.read_bytes().decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise self._foreign("it is not UTF-8 text") from None
        if not lines:  # killed before its header was written: a new journal
            return
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or not isinstance(header.get("fingerprint"), str):
            raise self._foreign('its first line is not a {"fingerprint": ...} header')
        if header["fingerprint"] != self.stamp:
            os.replace(self.path, self.path.with_name(self.NAME + ".stale"))
            return
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                self.results[str(entry["key"])] = (_number(entry["ttft_s"]), _number(entry["tpot_s"]),
                                                   str(entry["reason"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # a line cut short by a kill: that row is simulated again

    def _foreign(self, why: str) -> UserError:
        return UserError(f"{self.path} is not a serving study journal ({why}); move it away or run the study "
                         "in another run dir")

    def append(self, key: str, result: tuple[float, float, str]) -> None:
        ttft, tpot, reason = result
        entry = {"key": key, "ttft_s": None if math.isnan(ttft) else ttft,
                 "tpot_s": None if math.isnan(tpot) else tpot, "reason": reason}
        self._file.write(json.dumps(entry) + "\n")
        self._file.flush()
        self.results[key] = result

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RowJournal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ignore_sigint() -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (it stops between rows)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def simulate_rows(rows: list[dict], keys: list[str], simulate: Callable[[dict], tuple[float, float, str]],
                  jobs: int | None, out: Path, stamp: str) -> list[tuple[float, float, str]]:
    """``simulate(row)`` of every row, in order, journaled in ``out`` under ``stamp`` (module doc): rows
    the journal holds are read back, the others simulated in ``jobs`` processes (``None``: one per CPU
    core; each row is its own seeded simulation, so the answers do not depend on it), or here for one.
    SIGINT / SIGTERM stop between rows: those not started are dropped, those in flight end and are kept,
    then :class:`StudyInterrupted`."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from planner.checkpoint import StopRequest

    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"study.jobs must be >= 1, got {jobs}")
    with RowJournal(out, stamp) as journal, StopRequest() as stop:
        todo = [(k, row) for k, row in zip(keys, rows, strict=True) if k not in journal.results]
        if journal.reused:
            print(f"journal: {journal.reused} row(s) read back from {journal.path}, {len(todo)} to simulate")
        if jobs == 1 or len(todo) < 2:
            for key, row in todo:
                if stop():
                    break
                journal.append(key, simulate(row))
        else:
            pool = ProcessPoolExecutor(jobs, initializer=_ignore_sigint)
            pending = {pool.submit(simulate, row): key for key, row in todo}
            try:
                while pending and not stop():  # each row journaled as it ends, whatever the order
                    done, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in done:
                        journal.append(pending.pop(future), future.result())
            finally:
                for future in pending:
                    future.cancel()  # those not started; the ones in flight end and are kept below
                for future, key in pending.items():
                    if not future.cancelled():
                        journal.append(key, future.result())
                pool.shutdown()
        missing = sum(k not in journal.results for k in keys)
        if missing:  # stopped on request before the last row (a stop after it has lost nothing)
            raise StudyInterrupted(len(rows) - missing, len(rows), journal.path, stop.signal)
        return [journal.results[k] for k in keys]
