"""The layers hold: plugins use only the core's public API, and nothing depends the wrong way.

Static: every ``.py`` under each distribution's ``src/`` is parsed with ``ast`` (imports
inside functions and under ``if TYPE_CHECKING:`` count), nothing is imported. The rules:

- a plugin (any distribution but the core and the CLI) imports from the core only the
  public modules and names of ``slr._api.PUBLIC_MODULES`` (``docs/api.md`` shows the same
  list; the CLI, the product's front end, may import internals);
- product code (anything under ``*/src``) never imports the test kit (the ``slr-testkit``
  distribution, ``slr_testkit``), apart from the test kit itself, which is released with
  the core at one version and may use its internals, as the CLI may;
- only the CLI distribution imports ``slr_cli``, and nothing else depends on it;
- the core imports no plugin package and not the CLI.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from attrs import frozen

import slr
from slr._api import ALL, OWN_ALL, PUBLIC_MODULES, TEST_KIT

ROOT = Path(__file__).resolve().parents[1]
CORE_SRC = ROOT / "core" / "src"
GROUPS = ("core", "cli", "testkit", "plugins/*", "adapters/*", "sandbox_backends/*", "loggers/*")

#: (file, imported module) pairs that break a rule today, each with the reason it may
ALLOWED: dict[tuple[str, str], str] = {}


@frozen
class Distribution:
    folder: str
    name: str
    role: str  # "core", "cli", "plugin" or "testkit"
    packages: frozenset[str]
    dependencies: tuple[str, ...]


@frozen
class Import:
    file: str
    line: int
    module: str
    """The module imported (``from pkg import mod``: ``pkg.mod`` when ``mod`` is a module)."""
    name: str | None
    """The name taken from ``module`` (``None``: the module itself)."""
    binds: str | None = None
    """``import M`` / ``import M as N``: the name it binds in the file."""


def _top(module: str) -> str:
    return module.split(".")[0]


def _is_test_kit(module: str) -> bool:
    return any(module == kit or module.startswith(kit + ".") for kit in TEST_KIT)


def _distributions() -> list[Distribution]:
    found = []
    for pattern in GROUPS:
        for pyproject in sorted(ROOT.glob(f"{pattern}/pyproject.toml")):
            folder = pyproject.parent
            if folder.name.startswith("_"):
                continue
            project = tomllib.loads(pyproject.read_text())["project"]
            deps = list(project.get("dependencies", []))
            for extra in project.get("optional-dependencies", {}).values():
                deps += extra
            rel = str(folder.relative_to(ROOT))
            packages = frozenset(p.name for p in (folder / "src").iterdir() if p.is_dir())
            role = "core" if rel == "core" else "cli" if rel == "cli" else "plugin"
            if packages and all(_is_test_kit(p) for p in packages):
                role = "testkit"  # slr_testkit: the kit's own rules
            found.append(
                Distribution(
                    folder=rel,
                    name=project["name"],
                    role=role,
                    packages=packages,
                    dependencies=tuple(deps),
                )
            )
    return found


DISTRIBUTIONS = _distributions()
CLI = next(d for d in DISTRIBUTIONS if d.role == "cli")
CORE = next(d for d in DISTRIBUTIONS if d.role == "core")


def _core_file(module: str) -> Path | None:
    base = CORE_SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_module(module: str, dist: Distribution) -> bool:
    base = ROOT / dist.folder / "src" / Path(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@functools.cache
def _imports(dist: Distribution) -> tuple[Import, ...]:
    return tuple(_read_imports(dist))


def _read_imports(dist: Distribution) -> Iterator[Import]:
    src = ROOT / dist.folder / "src"
    for path in sorted(src.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        parts = path.relative_to(src).with_suffix("").parts
        package = ".".join(parts[:-1])  # a module's package; an __init__'s: itself
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    binds = alias.asname or (alias.name if "." not in alias.name else None)
                    yield Import(rel, node.lineno, alias.name, None, binds)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if alias.name != "*" and (_is_module(sub, dist) or _core_file(sub)):
                        yield Import(rel, node.lineno, sub, None)
                    else:
                        yield Import(rel, node.lineno, base, alias.name)


def _own_all(module: str) -> tuple[str, ...]:
    path = _core_file(module)
    assert path is not None, module
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return tuple(ast.literal_eval(node.value))  # type: ignore[arg-type]
    raise AssertionError(f"{module} is listed as OWN_ALL but has no literal __all__")


def _allows(module: str, name: str) -> bool:
    names = PUBLIC_MODULES[module]
    if names == ALL:
        return not name.startswith("_")
    if names == OWN_ALL:
        return name in _own_all(module)
    return name in names


def _attribute_uses(file: str, bound: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse((ROOT / file).read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == bound
        ):
            yield node.lineno, node.attr


def public_api_violations(dist: Distribution) -> list[tuple[str, str, str]]:
    """(where, imported module, what is wrong) for each core import outside the public API."""
    found = []
    for imp in _imports(dist):
        if _top(imp.module) != "slr":
            continue
        where = f"{imp.file}:{imp.line}"
        shown = f"{imp.module}.{imp.name}" if imp.name else imp.module
        if imp.module not in PUBLIC_MODULES:
            found.append(
                (
                    where,
                    imp.module,
                    f"imports {shown}: {imp.module} is internal to slr-core (not in "
                    "slr._api.PUBLIC_MODULES); use a public module (docs/api.md), or make "
                    "what the plugin needs public there and in docs/api.md",
                )
            )
        elif imp.name is None and isinstance(PUBLIC_MODULES[imp.module], tuple):
            found.append(
                (
                    where,
                    imp.module,
                    f"imports the module {imp.module}, of which only "
                    f"{', '.join(PUBLIC_MODULES[imp.module])} is public: import those names",
                )
            )
        elif imp.name is None and imp.binds and PUBLIC_MODULES[imp.module] != ALL:
            for line, attr in _attribute_uses(imp.file, imp.binds):
                if not _allows(imp.module, attr) and f"{imp.module}.{attr}" not in PUBLIC_MODULES:
                    found.append(
                        (
                            f"{imp.file}:{line}",
                            imp.module,
                            f"uses {imp.module}.{attr}, which is not public",
                        )
                    )
        elif imp.name is not None and not _allows(imp.module, imp.name):
            found.append(
                (
                    where,
                    imp.module,
                    f"imports {shown}: {imp.name!r} is not among {imp.module}'s public names "
                    f"({PUBLIC_MODULES[imp.module]})",
                )
            )
    return found


def _report(found: list[tuple[str, str, str]]) -> list[str]:
    """The violations not allowed by ``ALLOWED``, one line each."""
    return [
        f"{where}: {message}"
        for where, module, message in found
        if (where.split(":")[0], module) not in ALLOWED
    ]


def kit_violations() -> list[tuple[str, str, str]]:
    found = []
    for dist in DISTRIBUTIONS:
        for imp in _imports(dist):
            module = imp.module if imp.name is None else f"{imp.module}.{imp.name}"
            inside_kit = _is_test_kit(
                imp.file.removeprefix(f"{dist.folder}/src/")[:-3].replace("/", ".")
            )
            if (_is_test_kit(imp.module) or _is_test_kit(module)) and not inside_kit:
                found.append(
                    (
                        f"{imp.file}:{imp.line}",
                        imp.module,
                        f"imports the test kit ({module}): product code runs without it; "
                        "move the code that needs it under tests/",
                    )
                )
    return found


def cli_violations() -> list[tuple[str, str, str]]:
    found = []
    for dist in DISTRIBUTIONS:
        if dist.role == "cli":
            continue
        for imp in _imports(dist):
            if _top(imp.module) in CLI.packages:
                found.append(
                    (
                        f"{imp.file}:{imp.line}",
                        imp.module,
                        f"imports {imp.module}, the CLI: what a plugin's command shares with "
                        "the CLI's lives in the core (slr.config.cli, slr.preflight.gate)",
                    )
                )
        for dep in dist.dependencies:
            if re.match(rf"{re.escape(CLI.name)}\b(?![-\w])", dep):
                found.append(
                    (
                        f"{dist.folder}/pyproject.toml",
                        CLI.name,
                        f"depends on {dep!r}, the CLI distribution: a plugin depends on "
                        "slr-core only",
                    )
                )
    return found


def core_violations() -> list[tuple[str, str, str]]:
    others = {p: d for d in DISTRIBUTIONS if d.role != "core" for p in d.packages}
    return [
        (
            f"{imp.file}:{imp.line}",
            imp.module,
            f"the core imports {imp.module} (distribution {others[_top(imp.module)].name}): "
            "the core never imports a plugin or the CLI; a plugin registers through a hook",
        )
        for imp in _imports(CORE)
        if _top(imp.module) in others
    ]


PLUGINS = [d for d in DISTRIBUTIONS if d.role == "plugin"]


@pytest.mark.parametrize("dist", PLUGINS, ids=lambda d: d.folder)
def test_plugins_import_only_the_public_api(dist: Distribution) -> None:
    bad = _report(public_api_violations(dist))
    assert not bad, "\n".join(bad)


def test_product_code_never_imports_the_test_kit() -> None:
    bad = _report(kit_violations())
    assert not bad, "\n".join(bad)


def test_only_the_cli_imports_or_depends_on_the_cli() -> None:
    bad = _report(cli_violations())
    assert not bad, "\n".join(bad)


def test_the_core_imports_no_plugin_and_not_the_cli() -> None:
    bad = _report(core_violations())
    assert not bad, "\n".join(bad)


def test_every_allowed_violation_still_happens() -> None:
    found = [*kit_violations(), *cli_violations(), *core_violations()]
    for dist in PLUGINS:
        found += public_api_violations(dist)
    happening = {(where.split(":")[0], module) for where, module, _ in found}
    stale = [f"{file}: {module}" for file, module in ALLOWED if (file, module) not in happening]
    assert not stale, f"allowed violations that no longer happen, remove them from ALLOWED: {stale}"


def _module_names(body: list[ast.stmt]) -> set[str]:
    """The names a module defines at its top level (in ``if`` and ``try`` blocks too: the
    lazily re-exported names are imported under ``if TYPE_CHECKING:``)."""
    defined: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            blocks = [node.body, node.orelse]
            if isinstance(node, ast.Try):
                blocks += [node.finalbody, *(h.body for h in node.handlers)]
            for block in blocks:
                defined |= _module_names(block)
    return defined


def test_every_public_module_and_name_exists() -> None:
    missing = []
    for module, names in PUBLIC_MODULES.items():
        path = _core_file(module)
        if path is None:
            missing.append(f"{module}: no such module")
            continue
        if names == OWN_ALL:
            names = _own_all(module)
        if names == ALL:
            continue
        defined = _module_names(ast.parse(path.read_text()).body)
        missing += [f"{module}.{n}" for n in names if n not in defined]
    assert not missing, missing


def _documented() -> dict[str, str | frozenset[str]]:
    """``docs/api.md``'s table of public modules: module -> ALL, OWN_ALL or the names."""
    rows = {}
    for line in (ROOT / "docs" / "api.md").read_text().splitlines():
        m = re.match(r"\|\s*`(slr(?:\.\w+)*)`\s*\|([^|]*)\|", line)
        if not m:
            continue
        cell = m.group(2).strip()
        if cell == "all":
            rows[m.group(1)] = ALL
        elif cell == "its `__all__`":
            rows[m.group(1)] = OWN_ALL
        else:
            rows[m.group(1)] = frozenset(re.findall(r"`(\w+)`", cell))
    return rows


def test_the_docs_page_lists_the_public_modules() -> None:
    expected = {
        module: names if isinstance(names, str) else frozenset(names)
        for module, names in PUBLIC_MODULES.items()
    }
    documented = _documented()
    assert documented == expected, (
        f"docs/api.md and slr._api.PUBLIC_MODULES differ: only in the docs "
        f"{sorted(documented.items() - expected.items())}, only in the code "
        f"{sorted(expected.items() - documented.items())}"
    )


def test_slr_re_exports_what_its_all_names() -> None:
    lazy = slr._EXPORTS
    assert set(slr.__all__) == {"__version__", "hookimpl", *lazy}
    for name, module in lazy.items():
        assert getattr(slr, name) is getattr(importlib.import_module(module), name), name
        assert _allows(module, name), f"slr re-exports {module}.{name}, which is not public"
    # the names type checkers see (under TYPE_CHECKING) are the ones loaded at run time
    typed = {}
    for node in ast.parse((CORE_SRC / "slr" / "__init__.py").read_text()).body:
        if isinstance(node, ast.If):
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom):
                    typed.update({a.name: sub.module for a in sub.names})
    assert typed == lazy


def test_import_slr_loads_only_hookspecs() -> None:
    """``import slr`` stays cheap: every plugin imports it in every process."""
    code = "import slr, sys; print(' '.join(sorted(m for m in sys.modules if 'slr' in m)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["slr", "slr.hookspecs"]
