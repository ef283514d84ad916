"""Checkpoints of a search (written atomically after every chunk) and clean stops on SIGINT/SIGTERM.

A checkpoint is a pickle of the planner and its evaluator (history, cache, random generators, elite)
plus the config it was made with. The cost context and the action space are not pickled: they are
rebuilt from the config on resume and re-attached (pickle's persistent ids), so a checkpoint stays
small and a resumed run uses exactly the objects a fresh one would.

A checkpoint is read back through :mod:`planner.safe_pickle`: it may construct plain data, numpy
arrays and generators, config nodes (omegaconf's, of the project's schemas) and the classes in
:data:`CHECKPOINT_CLASSES`, nothing else, so a crafted file is refused, naming what it asked for,
instead of running it. A checkpoint missing one of the fields a resume reads is refused naming it.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path

from planner import safe_pickle
from planner.errors import UserError

__all__ = ["CHECKPOINT_NAME", "CHECKPOINT_CLASSES", "save_checkpoint", "load_checkpoint", "config_difference",
           "StopRequest"]

CHECKPOINT_NAME = "checkpoint.pkl"
_VERSION = 1

#: the planners a checkpoint may hold (``state["planner"]``)
_PLANNERS = frozenset({"planner.search.PPOSearch", "planner.baselines.RandomSearch", "planner.baselines.RandomWalk",
                       "planner.baselines.Annealing", "planner.baselines.Genetic"})
_EVALUATOR = "planner.evaluator.Evaluator"

#: the project's classes a checkpoint holds besides data and config nodes: the planner, the
#: evaluator and what they keep (the config schemas of ``cfg`` are allowed by
#: :func:`planner.safe_pickle.is_config_schema`)
CHECKPOINT_CLASSES = _PLANNERS | {_EVALUATOR, "planner.elite.Elite", "planner.ppo.PPOConfig"}

_ALLOWED = safe_pickle.DATA | safe_pickle.OMEGACONF | CHECKPOINT_CLASSES

#: what a resume reads from a checkpoint, each with the check its value must pass and what that means
_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "config": (lambda v: isinstance(v, dict), "a dict"),
    "planner": (lambda v: _qualname(v) in _PLANNERS, "a planner"),
    "evaluator": (lambda v: _qualname(v) == _EVALUATOR, f"an {_EVALUATOR}"),
    "chunk": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a chunk count"),
    "wall_s": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number of seconds"),
}


def _qualname(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class _Pickler(pickle.Pickler):
    def __init__(self, fh, external: dict[str, object]):
        super().__init__(fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._ids = {id(obj): name for name, obj in external.items()}

    def persistent_id(self, obj):
        return self._ids.get(id(obj))


def save_checkpoint(run_dir: str | os.PathLike, state: dict, external: dict[str, object]) -> Path:
    """Pickle ``state`` to ``run_dir/checkpoint.pkl`` through a temporary file and a rename; objects
    in ``external`` (by identity) are stored as references to be supplied on load."""
    path = Path(run_dir) / CHECKPOINT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    _Pickler(buffer, external).dump({"version": _VERSION, **state})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(buffer.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(run_dir: str | os.PathLike, external: dict[str, object]) -> dict:
    """The state saved in ``run_dir``, read through :mod:`planner.safe_pickle` (module doc), with
    every field a resume reads; a one-line :class:`~planner.errors.UserError` naming the file and the
    problem if there is none, it is unreadable, asks for a class no checkpoint holds, or lacks a field."""
    path = Path(run_dir) / CHECKPOINT_NAME
    if not path.is_file():
        raise UserError(f"resume: no {CHECKPOINT_NAME} in {run_dir}")
    try:
        with path.open("rb") as fh:
            state = safe_pickle.load(fh, _ALLOWED, external, rule=safe_pickle.is_config_schema)
    except safe_pickle.RefusedPickle as exc:
        raise UserError(f"resume: {path}: {exc}") from None
    except (pickle.UnpicklingError, EOFError) as exc:
        raise UserError(f"resume: {path} is not a readable checkpoint ({exc or 'empty'})") from None
    if not isinstance(state, dict) or state.get("version") != _VERSION:
        raise UserError(f"resume: {path} was written by another version of shard-search")
    missing = [name for name in _FIELDS if name not in state]
    if missing:
        raise UserError(f"resume: {path} has no {missing[0]!r}")
    for name, (check, meaning) in _FIELDS.items():
        if not check(state[name]):
            raise UserError(f"resume: {path}: {name!r} is not {meaning} (a {_qualname(state[name])})")
    return state


def _flatten(data, prefix: str = "") -> dict[str, object]:
    if isinstance(data, dict):
        out: dict[str, object] = {}
        for key in sorted(data):
            out |= _flatten(data[key], f"{prefix}{key}.")
        return out
    return {prefix[:-1]: data}


def config_difference(saved: dict, current: dict) -> str | None:
    """The first dotted key whose value differs, as ``"key: saved X, now Y"``; ``None`` if equal."""
    a, b = _flatten(saved), _flatten(current)
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            return f"{key}: checkpoint has {a.get(key, '<absent>')!r}, this run has {b.get(key, '<absent>')!r}"
    return None


class StopRequest:
    """Context manager: SIGINT and SIGTERM set a flag (read by calling the object) instead of
    killing the process, so the search stops between two proposals; old handlers come back on exit."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: dict[int, object] = {}

    def __call__(self) -> bool:
        return self.signal is not None

    def request(self, signum: int = signal.SIGINT, _frame=None) -> None:
        self.signal = signum

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers, the flag still works
                self._old[sig] = signal.signal(sig, self.request)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
