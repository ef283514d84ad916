"""Checkpoints of a search (written atomically after every chunk) and clean stops on SIGINT/SIGTERM.

A checkpoint is a pickle of the planner and its evaluator (history, cache, random generators, elite)
plus the config it was made with. The cost context and the action space are not pickled: they are
rebuilt from the config on resume and re-attached (pickle's persistent ids), so a checkpoint stays
small and a resumed run uses exactly the objects a fresh one would.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import tempfile
from pathlib import Path

__all__ = ["CHECKPOINT_NAME", "save_checkpoint", "load_checkpoint", "config_difference", "StopRequest"]

CHECKPOINT_NAME = "checkpoint.pkl"
_VERSION = 1


class _Pickler(pickle.Pickler):
    def __init__(self, fh, external: dict[str, object]):
        super().__init__(fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._ids = {id(obj): name for name, obj in external.items()}

    def persistent_id(self, obj):
        return self._ids.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, fh, external: dict[str, object]):
        super().__init__(fh)
        self._external = external

    def persistent_load(self, pid):
        if pid not in self._external:
            raise pickle.UnpicklingError(f"checkpoint refers to {pid!r}, which this run does not provide")
        return self._external[pid]


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
    """The state saved in ``run_dir``; ``ValueError`` naming the problem if there is none or it is
    unreadable."""
    path = Path(run_dir) / CHECKPOINT_NAME
    if not path.is_file():
        raise ValueError(f"resume: no {CHECKPOINT_NAME} in {run_dir}")
    try:
        with path.open("rb") as fh:
            state = _Unpickler(fh, external).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise ValueError(f"resume: {path} is not a readable checkpoint ({exc})") from None
    if not isinstance(state, dict) or state.get("version") != _VERSION:
        raise ValueError(f"resume: {path} was written by another version of shard-search")
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
