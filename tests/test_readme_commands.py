"""Every Hydra command the README and the reference pages under ``docs/`` show (their shell blocks and their
prose) composes: its groups, options and keys exist; every ``python -m validation...`` command the docs quote
names a runnable module; every model named as ``model=`` is one the catalog knows; every repository path and
relative link they give is there.

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
#: the README and every markdown page under docs/
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _commands(paths: list[Path] = DOCS) -> list[str]:
    """The ``shard-search`` / ``shard-sim`` / ``shard-validate`` lines in the ```bash blocks of ``paths``,
    with their continuation lines joined and comments cut."""
    return [c for path in paths for c in _block_commands(path.read_text())]


def _block_commands(text: str) -> list[str]:
    """The app lines of one markdown text's ```bash blocks."""
    out, block, pending = [], False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            block, pending = line.strip() == "```bash", ""
            continue
        if not block:
            continue
        command = pending + line.split("#", 1)[0].strip()
        if command.endswith("\\"):
            pending = command[:-1] + " "
            continue
        pending = ""
        if command.split(" ", 1)[0] in APPS:
            out.append(command.strip())
    return out


def _inline_commands(paths: list[Path] = DOCS) -> list[str]:
    """The commands the prose of ``paths`` quotes in backticks (a span may wrap across lines)."""
    out = []
    for path in paths:
        flat = path.read_text().replace("\n", " ")
        spans = re.finditer(r"`((?:shard-search|shard-sim|shard-validate)\b[^`]*)`", flat)
        out += [" ".join(m.group(1).split()) for m in spans]
    return out


def _runnable(command: str) -> bool:
    """Not a placeholder (``<scenario>``, ``...``, ``NAME``, ``RUN_DIR``), a sweep or a launcher plugin."""
    return not re.search(r"<[^>]*>|\.\.\.|=[A-Z_]+(\s|$)|(^|\s)(-m|--multirun)(\s|$)|hydra/launcher", command)


COMMANDS = sorted({c for c in _commands() + _inline_commands() if _runnable(c)})


def test_the_docs_are_read():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "docs/commands.md", "docs/serving.md", "docs/validation.md"} <= names


def test_the_readme_shows_commands_of_every_app():
    readme = _commands([ROOT / "README.md"]) + _inline_commands([ROOT / "README.md"])
    assert {c.split()[0] for c in readme} == set(APPS)
    assert {c.split()[0] for c in COMMANDS} == set(APPS)
    assert len(_commands()) >= 25 and len(COMMANDS) >= 40


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


def _module_commands() -> list[str]:
    """The ``python -m validation...`` modules the README, the Makefile, the configs, the data and report
    notes and the validation modules' own docstrings quote (a span may wrap across lines)."""
    paths = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "conf").rglob("*.yaml")),
             *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "validation").rglob("*.md")),
             *sorted((ROOT / "validation").rglob("*.py"))]
    found = set()
    for path in paths:
        flat = " ".join(path.read_text().split())
        found |= set(re.findall(r"python -m (validation(?:\.\w+)+)(?![\w.])", flat))  # not a <placeholder>
    return sorted(found)


def test_the_docs_quote_validation_commands():
    assert len(_module_commands()) >= 25


@pytest.mark.parametrize("module", _module_commands())
def test_a_quoted_validation_command_names_a_runnable_module(module):
    """``python -m validation.<path>`` names a script (one with a ``__main__`` guard) or a package with a
    ``__main__``, found at that path: a moved script leaves no dead command behind."""
    base = ROOT / module.replace(".", "/")
    script = base.with_suffix(".py")
    if script.is_file():
        assert 'if __name__ == "__main__":' in script.read_text(), f"{module}: no __main__ guard"
    else:
        assert (base / "__main__.py").is_file(), f"{module}: no such script or runnable package"


def test_validation_paths_the_docs_quote_exist():
    """Every ``validation/....py`` file the README, the docs and the validation notes name is there."""
    paths = [*DOCS, *sorted((ROOT / "validation").rglob("*.md"))]
    quoted = {m for p in paths for m in re.findall(r"\bvalidation/[\w/]+\.py\b", p.read_text())}
    assert sorted(q for q in quoted if not (ROOT / q).is_file() and not _named_as_measured(q)) == []


def _named_as_measured(path: str) -> bool:
    """A measurement script's old path, quoted where the data notes say how shipped rows name their source."""
    return path in {"validation/measure_h100.py", "validation/measure_moe.py", "validation/measure_decode.py",
                    "validation/measure_linear_attention.py", "validation/measure_launch.py"}


#: the top-level folders a quoted repository path may start with
_TOP = ("simcore", "planner", "topologies", "validation", "conf", "tests", "docs")


def test_repository_paths_the_docs_quote_exist():
    """Every path in backticks that starts at a top-level folder (``simcore/serving/scheduler.py``,
    ``validation/studies/``) is a file or folder of the repository; placeholders (``<study>``) aside."""
    missing = []
    for path in DOCS:
        for span in re.findall(r"`([^`\s]+)`", path.read_text()):
            if span.split("/", 1)[0] in _TOP and "/" in span and not re.search(r"[<*{]", span):
                target = span.split("::", 1)[0].rstrip(".,;:")
                if not (ROOT / target).exists() and not _named_as_measured(target):
                    missing.append(f"{path.name}: {span}")
    assert missing == []


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a markdown file's headings: lower case, punctuation dropped, spaces to -."""
    heads = re.findall(r"^#+\s+(.*)$", path.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_relative_links_resolve():
    """Every relative markdown link of the README and the docs (``[text](docs/serving.md#the-serving-search)``,
    an image) points at a file of the repository, and at one of its headings where it names one."""
    broken = []
    for path in [*DOCS, *sorted((ROOT / "validation" / "reports").rglob("history.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            file, _, anchor = target.partition("#")
            dest = path.parent / file if file else path
            if not dest.exists() or anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path}: {target}")
    assert broken == []


def _model_names() -> list[str]:
    """Every ``model=NAME`` / ``model.name=NAME`` the README and the docs write (placeholders aside)."""
    found = set()
    for path in DOCS:
        found |= set(re.findall(r"(?<![\w.])model(?:\.name)?=([\w./-]*[\w])", path.read_text()))
    return sorted(n for n in found if not re.fullmatch(r"[A-Z_]+", n) and "," not in n)


def test_the_docs_name_models():
    assert len(_model_names()) >= 4


@pytest.mark.parametrize("name", _model_names())
def test_every_model_the_docs_name_works(name):
    """``model=`` takes a preset, a published id of the same shape or a ``config.json`` path: a name the
    docs give must be one of them (a sweep's comma list is split by the sweep's own test)."""
    from simcore.models import preset_for

    if name.endswith(".json"):
        assert (ROOT / name).is_file(), name
    else:
        assert preset_for(name) is not None, f"model={name} is no preset or published id of the catalog"


def test_sweep_model_lists_work():
    """The comma lists of a sweep (``model=deepseek-v3,gpt-moe-1.6t``) name catalog models too."""
    from simcore.models import preset_for

    lists = {m for p in DOCS for m in re.findall(r"(?<![\w.])model=([\w./-]+(?:,[\w./-]+)+)", p.read_text())}
    assert lists
    assert [n for lst in lists for n in lst.split(",") if preset_for(n) is None] == []
