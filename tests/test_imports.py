"""Package layout: no import cycles inside ``validation/``; one package per study.

The graph is read from the source with ``ast`` (nothing is imported), counting every ``import`` and
``from ... import`` of a ``validation`` module, at module level or inside a function (a deferred import
is still a cycle, only hidden). ``simcore/`` never importing ``planner/`` is checked in
``tests/test_newcomer.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "validation"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _resolve(base: str, level: int, name: str, is_package: bool) -> str:
    """The absolute module of ``from <level dots><base> import ...`` written in module ``name``."""
    if not level:
        return base
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([base] if base else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``validation`` modules that module ``name`` (at ``path``) imports; ``from pkg import mod`` names
    the submodule when ``mod`` is one, else the package."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, name, path.name == "__init__.py")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name}
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _resolve("plot", 1, "validation.studies.moe", True) == "validation.studies.moe.plot"
    assert _resolve("common", 2, "validation.studies.moe.plot", False) == "validation.studies.common"


def test_validation_has_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert sum(map(len, graph.values())) > 50  # the walk does see the imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_each_study_is_a_package_with_an_entry() -> None:
    studies = ROOT / PACKAGE / "studies"
    for name in ("collectives", "rewrites", "inference", "kernels", "moe", "serving", "fidelity"):
        entry = studies / name / "__init__.py"
        assert entry.is_file(), entry
        tree = ast.parse(entry.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"run", "main"} & defined, f"{entry}: no run() or main()"


def test_the_validation_root_holds_no_scripts() -> None:
    """Every fit, measurement and report script lives in the package of its study (``studies/<study>/``), the
    benchmarks in ``bench/``, what they share in ``studies/common/``: the root holds only the package marker."""
    assert sorted(p.name for p in (ROOT / PACKAGE).glob("*.py")) == ["__init__.py"]
    packages = {p.name for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").is_file()}
    assert packages == {"apps", "bench", "report", "studies"}
