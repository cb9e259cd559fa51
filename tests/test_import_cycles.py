"""No two modules of the workspace import each other, directly or around a longer loop.

A cycle means each side reaches into the other (``backend.py`` <-> ``sandbox.py`` was the
usual shape); the rule instead is that a module passes its collaborator what it needs (a
function, a record, a small object). Imports under ``if TYPE_CHECKING:`` count: a
type-only cycle is still two modules that know each other's insides.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("core", "cli", "plugins/*", "adapters/*", "sandbox_backends/*", "loggers/*")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pattern in GROUPS:
        for src in sorted(ROOT.glob(f"{pattern}/src")):
            for path in src.rglob("*.py"):
                parts = path.relative_to(src).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the workspace modules it imports (``from pkg import mod`` names ``pkg.mod``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    deps.add(sub if sub in modules else base)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_sees_a_type_only_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    )
    (pkg / "c.py").write_text("from . import a\n")
    modules = {"pkg": pkg / "__init__.py", **{f"pkg.{m}": pkg / f"{m}.py" for m in "abc"}}
    assert cycles(import_graph(modules)) == [["pkg.a", "pkg.b"]]


def test_no_module_imports_one_that_imports_it():
    modules = _modules()
    assert "slr.proxy.server" in modules and "slr_backend_docker.sandbox" in modules
    assert cycles(import_graph(modules)) == []
