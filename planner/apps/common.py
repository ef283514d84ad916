"""What every console app shares: one-line errors with exit code 2, atomic writes, the run dir."""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console

from planner.errors import JobFailed, UserError
from simcore.files import atomic_save_figure, atomic_write_json, atomic_write_text
from simcore.models import closest_ids

__all__ = ["cli_errors", "atomic_write_text", "atomic_save_figure", "atomic_write_json", "run_dir", "UserError", "JobFailed", "console",
           "check_known_keys", "config_errors_exit_2", "config_error_line", "typed_keys"]


def console():
    """A rich console that stays wide when output goes to a file or a pipe (logs, CI)."""

    c = Console()
    return c if c.is_terminal else Console(width=160)


def _in_sweep() -> bool:
    """Whether this call is a job of a Hydra multirun (any launcher: basic, joblib, Ray, Submitit)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # not under Hydra
        return False


_TASK_STARTED = False  # set once Hydra has composed the config and called the app's function
_FULL_ERROR_OURS = False  # HYDRA_FULL_ERROR set by config_errors_exit_2 for the run

#: lines of Hydra's and OmegaConf's messages that say nothing about the bad field
_NOISE = ("full_key:", "reference_type=", "object_type=", "Set the environment variable HYDRA_FULL_ERROR",
          "See https://hydra.cc/")


def config_error_line(exc: BaseException) -> str:
    """Hydra's message for a config it cannot compose (and its OmegaConf cause) as one line.

    An unknown key (``strategy.tpp=8``) or group option (``topology=h100-ib-rial``, ``model=kimi-k3``)
    is named with the closest known keys or options (:func:`suggest_line`), never with Hydra's advice to
    append it with ``+``. Any other message: each of its lines in order, an indented list (a group's
    options) joined with commas after its heading, the search path and the lines that name no field
    left out."""
    suggestion = suggest_line(exc)
    if suggestion:
        return suggestion
    parts: list[tuple[str, list[str]]] = []
    for e in (exc, exc.__cause__):
        if e is None or (parts and str(e).strip() in parts[0][0]):
            continue
        for raw in str(e).splitlines():
            line = raw.strip()
            if line == "Config search path:":
                break
            if not line or line.startswith(_NOISE):
                continue
            if raw[:1] in ("\t", " ") and parts and parts[-1][0].endswith(":"):
                parts[-1][1].append(line)  # an item of the list its heading opened
            else:
                parts.append((line, []))
    text = "; ".join(head.rstrip(".") + (" " + ", ".join(items) if items else "") for head, items in parts)
    override = getattr(exc, "override", None)  # a malformed override: its message does not quote it
    if isinstance(override, str) and override not in text:
        text = f"{override}: {text}"
    return text or type(exc).__name__


_UNKNOWN_KEY = re.compile(r"Could not override '([\w.]+)'.*?Key '(\w+)' not in '(\w+)'", re.S)
_UNKNOWN_OPTION = re.compile(r"Could not find '([\w/]+?)/([^']+)'\s*Available options in '[^']+':(.*)", re.S)


def _closest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word.lower(), [k.lower() for k in known], n=3, cutoff=0.5)
    names = [k for c in close for k in known if k.lower() == c][:3]
    return f"; closest: {', '.join(names)}" if names else f"; known: {', '.join(known)}"


def suggest_line(exc: BaseException) -> str | None:
    """One line for an unknown key or group option, naming the closest known ones; None for other errors."""
    text = "\n".join(str(e) for e in (exc, exc.__cause__) if e is not None)
    key = _UNKNOWN_KEY.search(text)
    if key:
        full, leaf, _schema = key.groups()
        parts = full.split(".")
        depth = parts.index(leaf) if leaf in parts else len(parts) - 1
        parent, name = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
        known = _schema_keys(_schema) or _keys_under(parent)
        return f"{name}: unknown key" + (_closest(leaf, known) if known else "")
    option = _UNKNOWN_OPTION.search(text)
    if option:
        group, name, listed = option.groups()
        listed = listed.split("Config search path:", 1)[0]
        known = [o.strip() for o in listed.replace("\n", ",").split(",")
                 if o.strip() and not o.strip().endswith("_schema")]  # a schema is no option to pick
        if group == "model":
            closest = closest_ids(name)
            hint = f"; closest: {', '.join(closest)}" if closest else "; see python -m simcore.models.catalog"
            return f"model: unknown model {name!r} (a preset, a published id or a config.json path){hint}"
        return f"{group}: unknown option {name!r}" + _closest(name, known)
    return None


def _schema_keys(schema: str) -> list[str]:
    """The keys of the structured config named ``schema`` (``RandomPlannerConfig``) in Hydra's store."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    def walk(repo: dict):
        for value in repo.values():
            if isinstance(value, dict):
                yield from walk(value)
            elif OmegaConf.is_config(value.node):
                yield value.node

    for node in walk(ConfigStore.instance().repo):
        if OmegaConf.get_type(node) is not None and OmegaConf.get_type(node).__name__ == schema:
            return [str(k) for k in node]
    return []


def _keys_under(parent: str) -> list[str]:
    """The keys of the app's schema under ``parent`` (``strategy``), from the schemas in Hydra's store."""
    from hydra.core.config_store import ConfigStore

    for name in ("sim_schema", "search_schema", "validate_schema", "report_schema"):
        try:
            node = ConfigStore.instance().load(f"{name}.yaml").node
        except Exception:  # noqa: BLE001  (a schema this process did not register)
            continue
        for part in parent.split(".") if parent else []:
            node = node.get(part) if hasattr(node, "get") else None
            if node is None:
                break
        if node is not None and hasattr(node, "keys"):
            return [str(k) for k in node]
    return []


def _task_started() -> None:
    """The app's function runs: errors from here on are the app's (:func:`cli_errors`)."""
    global _TASK_STARTED
    _TASK_STARTED = True


def config_errors_exit_2(entry: Callable) -> Callable:
    """Console entry around a ``@hydra.main`` app, so that Hydra's own errors are one line too.

    - A config Hydra cannot compose (a value of the wrong type, an unknown key or group option, a
      malformed override; a sweep's jobs are composed before any runs) is bad input: one line naming
      the key (:func:`config_error_line`), exit 2, as :func:`cli_errors` reports the app's own.
    - A sweep whose job had bad input (:class:`JobFailed`; Hydra names the job on the line before, the
      job's own line is in its log and in ``shard-report``): one line naming the field, exit 2.

    Hydra prints the first over several lines and the second with a traceback, and exits 1, unless
    ``HYDRA_FULL_ERROR=1`` lets the exception through; so the wrapper sets it for the run. Any other
    exception is a bug and keeps its traceback. A user's own ``HYDRA_FULL_ERROR=1`` gets Hydra's full
    report as before."""

    @functools.wraps(entry)
    def wrapper(*args, **kwargs):
        from hydra.errors import HydraException

        global _FULL_ERROR_OURS
        multirun = any(a in ("-m", "--multirun") for a in sys.argv[1:])
        if os.environ.get("HYDRA_FULL_ERROR") != "1":
            os.environ["HYDRA_FULL_ERROR"] = "1"
            _FULL_ERROR_OURS = True
        try:
            return entry(*args, **kwargs)
        except SystemExit as exc:
            if exc.code == 1 and not _TASK_STARTED and not multirun:
                sys.exit(2)
            raise
        except (HydraException, OmegaConfBaseException) as exc:
            if not _FULL_ERROR_OURS or _TASK_STARTED:  # the user asked for Hydra's report, or not composition
                raise
            print(f"error: {config_error_line(exc)}", file=sys.stderr)
            sys.exit(2)
        except JobFailed as exc:
            if not _FULL_ERROR_OURS:
                raise
            print(f"error: a job of the sweep had bad input: {exc} (`shard-report` lists every job)", file=sys.stderr)
            sys.exit(2)
        finally:
            if _FULL_ERROR_OURS:
                os.environ.pop("HYDRA_FULL_ERROR", None)
                _FULL_ERROR_OURS = False

    return wrapper


def cli_errors(func: Callable) -> Callable:
    """Turn bad-input exceptions into ``error: <message>`` on stderr and exit code 2 (no traceback).

    In a sweep the job raises :class:`JobFailed` instead of exiting: ``sys.exit`` would end the whole
    sweep (SystemExit escapes Hydra's per-job handler and a joblib/Ray worker), while an exception
    marks only this job failed; Hydra runs the others and exits non-zero at the end.
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):

        _task_started()
        try:
            return func(*args, **kwargs)
        except (ValueError, KeyError, FileNotFoundError, OmegaConfBaseException) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: {message}", file=sys.stderr)
            _log_to_files(f"error: {message}")
            if _in_sweep():
                raise JobFailed(message) from None
            sys.exit(2)

    return wrapper


def _log_to_files(message: str) -> None:
    """Put a line into the Hydra job's log file only (the console already shows it), so a report
    over a sweep can say why a job failed."""
    record = logging.LogRecord("shard", logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(record)


def run_dir() -> Path:
    """The Hydra run (or multirun job) directory, or the working directory outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


def typed_keys() -> set[str]:
    """The config keys the user set on the command line (``a.b=1``, ``+a.b=1``, ``++a.b=1``; group choices
    like ``workload=serving`` as ``workload``), or none outside a Hydra run (a pure ``run(cfg)`` call)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        task = HydraConfig.get().overrides.task
    except ValueError:  # not under Hydra
        return set()
    return {o.split("=", 1)[0].lstrip("+~") for o in task if "=" in o or o.startswith("~")}


def check_known_keys(cfg, schema: type, extra: tuple[str, ...] = ()) -> None:
    """Refuse keys the app's structured ``schema`` does not have (``UserError`` naming the first).

    Hydra's ``+key=value`` appends a key even to a structured node (``+topology.fabric=x``), which the
    app would then ignore without a word: a silently different model. ``extra``: top-level keys an app
    reads on purpose beyond its schema (``resume``). Nodes the schema leaves open (a plain ``dict``
    field, ``Any``, or ``None`` by default) are not checked inside; a node composed from a subclass of its
    field's schema (a ``planner`` option's own schema over :class:`planner.config.PlannerBaseConfig`) is
    checked against that subclass.
    """

    def walk(node, ref, path: str) -> None:
        known = list(ref.keys())
        for key in node:
            name = f"{path}{key}"
            if not path and key in extra:
                continue
            if key not in ref:
                raise UserError(f"{name}: unknown setting ({path.rstrip('.') or 'the config'} takes "
                                f"{', '.join(known)})")
            child, ref_child = node._get_node(key), ref._get_node(key)
            if isinstance(child, DictConfig) and isinstance(ref_child, DictConfig) and not ref_child._is_none() \
                    and OmegaConf.get_type(ref_child) not in (dict, None):
                own, base = OmegaConf.get_type(child), OmegaConf.get_type(ref_child)
                if isinstance(own, type) and own is not base and issubclass(own, base):
                    ref_child = OmegaConf.structured(own)  # a group option's schema extends the field's (planner=ppo)
                walk(child, ref_child, f"{name}.")

    walk(cfg, OmegaConf.structured(schema), "")
