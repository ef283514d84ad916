"""Every Hydra command the README shows (its shell blocks and its prose) composes: its groups, options and
keys exist.

A command that only reads well (``shard-search model=moonshotai/Kimi-K2.5``, a field's value written as a
group choice) would fail on the first try of a newcomer; this composes each one as its app does, without
running it. Lines with placeholders (``<scenario>``, ``...``), multirun sweeps and launcher plugins are left
to their own tests.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

ROOT = Path(__file__).resolve().parents[1]
APPS = {"shard-search": "search", "shard-sim": "sim", "shard-validate": "validate"}


def _commands() -> list[str]:
    """The README's ``shard-search`` / ``shard-sim`` / ``shard-validate`` lines in ```bash blocks, with
    their continuation lines joined and comments cut."""
    out, block, pending = [], False, ""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            block, pending = line.strip() == "```bash", ""
            continue
        if not block:
            continue
        text = pending + line.split("#", 1)[0].strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        if text.split(" ", 1)[0] in APPS:
            out.append(text.strip())
    return out


def _inline_commands() -> list[str]:
    """The commands the README's prose quotes in backticks (a span may wrap across lines)."""
    flat = (ROOT / "README.md").read_text().replace("\n", " ")
    spans = re.finditer(r"`((?:shard-search|shard-sim|shard-validate)\b[^`]*)`", flat)
    return [" ".join(m.group(1).split()) for m in spans]


def _runnable(command: str) -> bool:
    """Not a placeholder (``<scenario>``, ``...``, ``NAME``, ``RUN_DIR``), a sweep or a launcher plugin."""
    return not re.search(r"<[^>]*>|\.\.\.|=[A-Z_]+(\s|$)|(^|\s)(-m|--multirun)(\s|$)|hydra/launcher", command)


COMMANDS = sorted({c for c in _commands() + _inline_commands() if _runnable(c)})


def test_the_readme_shows_commands_of_every_app():
    assert {c.split()[0] for c in COMMANDS} == set(APPS)
    assert len(_commands()) >= 12 and len(COMMANDS) >= 25


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_composes(command):
    from planner.apps.common import check_known_keys
    from planner.apps.search import SearchAppConfig, register
    from planner.apps.sim import SimAppConfig
    from validation.apps.validate import ValidateAppConfig

    register()  # the apps' structured schemas (importing the sim and validate apps stores theirs)
    app, *args = shlex.split(command)
    overrides = [a for a in args if not a.startswith(("hydra.", "+resume="))]
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name=APPS[app], overrides=overrides)
    schema = {"search": SearchAppConfig, "sim": SimAppConfig, "validate": ValidateAppConfig}[APPS[app]]
    check_known_keys(cfg, schema, extra=("resume",))
