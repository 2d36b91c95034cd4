"""No import circles and no upward imports in the project's packages (``repro``, ``systems``, ``workloads``).

The layers, top to bottom (docs/development.md, "Layout"): the command line's entry points; experiments; systems;
backends and workloads; the simulation core; cost and oracle; metrics; core. A module may import its own layer and
the layers below it, never one above; two packages on one level (cost and oracle, backends and workloads) do not
import each other. Every ``import`` and ``from ... import`` counts, at module level, inside functions and under
``TYPE_CHECKING`` alike: a type-only import is a dependency a reader follows too. The graph is read with the
standard library's ``ast``, so nothing is imported to check it.
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


#: Each layer's level; a module belongs to the longest prefix listed. Entry points (``python -m ...``) sit on top.
LEVELS = {
    "repro.core": 0,
    "repro.metrics": 1,
    "repro.cost": 2,
    "repro.oracle": 2,
    "repro.sim": 3,
    "repro.backends": 4,
    "workloads": 4,
    "systems": 5,
    "repro.experiments": 6,
    "repro.__main__": 7,
    "repro.render": 7,
    "repro.plot": 7,
    "repro.profile": 7,
    "repro.cost.__main__": 7,
}


def layer_of(module: str, levels: Mapping[str, int]) -> str | None:
    """The layer a module belongs to (the longest listed prefix; None for the bare root package)."""
    while module and module not in levels:
        module = module.rpartition(".")[0]
    return module or None


def upward(graph: Mapping[str, set[str]], levels: Mapping[str, int], root: str = "repro") -> list[str]:
    """Every import that climbs a layer, crosses to a sibling layer of the same level, or comes from or goes to a
    module of no layer (the root package only holds the config resolvers every layer may run)."""
    found = []
    for mod in sorted(graph):
        if mod == root:
            continue
        mine = layer_of(mod, levels)
        for target in sorted(graph[mod] - {root}):
            theirs = layer_of(target, levels)
            if mine is None or theirs is None:
                found.append(f"{mod} -> {target} (no layer)")
            elif mine != theirs and levels[theirs] >= levels[mine]:
                found.append(f"{mod} ({mine}) -> {target} ({theirs})")
    return found


def test_no_import_circles() -> None:
    graph = import_graph(module_files(ROOT, PACKAGES))
    assert len(graph) > 80  # every module was read
    assert circles(graph) == []


def test_every_import_points_down() -> None:
    assert upward(import_graph(module_files(ROOT, PACKAGES)), LEVELS) == []


@pytest.mark.parametrize(("source", "found"), [
    ("from pkg.high import X\n", ["pkg.low.a (pkg.low) -> pkg.high (pkg.high)"]),  # climbs
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.side import X\n",  # a sibling, type-only
     ["pkg.low.a (pkg.low) -> pkg.side (pkg.side)"]),
    ("def f():\n    from pkg import loose\n", ["pkg.low.a -> pkg.loose (no layer)"]),  # a module of no layer
    ("from pkg.low import b\n", []),  # its own layer
])
def test_a_planted_upward_import_is_found(tmp_path: Path, source: str, found: list[str]) -> None:
    pkg = tmp_path / "pkg"
    for folder in (pkg, pkg / "low"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    for name in ("high", "side", "loose"):
        (pkg / f"{name}.py").write_text("X = 1\n")
    (pkg / "high.py").write_text("from pkg.low import a\nX = 1\n")  # down: fine
    (pkg / "low" / "b.py").write_text("")
    (pkg / "low" / "a.py").write_text(source)
    levels = {"pkg.low": 0, "pkg.side": 0, "pkg.high": 1}
    assert upward(import_graph(module_files(tmp_path, ["pkg"])), levels, root="pkg") == found


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
