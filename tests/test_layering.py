"""No import circles in the project's packages (``repro``, ``systems``, ``workloads``).

Every ``import`` and ``from ... import`` counts, at module level, inside functions and under ``TYPE_CHECKING`` alike:
a type-only import is a dependency a reader follows too. The graph is read with the standard library's ``ast``, so
nothing is imported to check it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("repro", "systems", "workloads")


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the packages (a package is its ``__init__``)."""
    mods: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def import_graph(mods: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name resolves to its longest known prefix; a module's own
    parent packages are not counted: importing ``repro.x`` runs ``repro/__init__`` first whoever imports it)."""

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    base = ".".join([*package[: len(package) - node.level + 1], base]).strip(".")
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            for name in names:
                target = known(name)
                if target and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    graph = import_graph(module_files(ROOT, PACKAGES))
    assert len(graph) > 80  # every module was read
    assert circles(graph) == []


@pytest.mark.parametrize("second", [
    "from pkg import a\n",  # a plain circle
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n",  # a type-only one
    "def f():\n    from .a import X\n",  # a relative import inside a function
])
def test_a_planted_circle_is_found(tmp_path: Path, second: str) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import Y\nX = 1\n")
    (pkg / "b.py").write_text(second + "Y = 2\n")
    (pkg / "c.py").write_text("from pkg import a\n")  # into the circle, not part of it
    assert circles(import_graph(module_files(tmp_path, ["pkg"]))) == [["pkg.a", "pkg.b"]]
    (pkg / "b.py").write_text("Y = 2\n")
    assert circles(import_graph(module_files(tmp_path, ["pkg"]))) == []
