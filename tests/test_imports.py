"""Package layout: no module imports one that imports it back, anywhere; one package per study.

The layers themselves (``validation > planner > topologies > simcore`` and simcore's own order) are
import-linter's contracts in ``pyproject.toml``, checked by ``make test``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "validation"
PACKAGES = ("simcore", "topologies", "planner", "validation")


def _cycles(graph) -> list[tuple[str, ...]]:
    """Every import edge ``a -> b`` whose target leads back to ``a``, as ``(a, b, ..., a)``."""
    out = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                out.append((module, *back))
    return out


def test_no_module_imports_one_that_imports_it_back() -> None:
    """import-linter's contracts (``make test``) forbid cycles between siblings; this also catches a
    package's ``__init__`` and one of its own modules importing each other. The graph is grimp's, the
    library import-linter reads imports with (every import counts, inside functions too)."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert len(graph.modules) > 200  # it does read the tree
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_planted_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "a.b", "a.c"):
        graph.add_module(name)
    graph.add_import(importer="a.b", imported="a.c")
    assert _cycles(graph) == []
    graph.add_import(importer="a.c", imported="a")
    graph.add_import(importer="a", imported="a.b")
    assert ("a", "a.b", "a.c", "a") in _cycles(graph)


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
