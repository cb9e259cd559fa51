"""Every hook is documented with its exact signature, its parameters' types and an example,
and exercised by some test."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import pytest

from slr import hookspecs

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "plugins" / "hooks.md"
HOOKS = [
    name
    for name, fn in vars(hookspecs).items()
    if inspect.isfunction(fn) and hasattr(fn, "slr_spec")
]


def test_there_are_hooks():
    assert {"register_agents", "on_trial_finished", "register_commands"} <= set(HOOKS)


def section(name: str) -> str:
    """The part of hooks.md under the hook's heading, up to the next heading."""
    params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
    heading = f"### `{name}({params})`"
    doc = DOC.read_text()
    assert heading in doc, f"document `{name}({params})` in docs/plugins/hooks.md"
    return re.split(r"^#{2,3} ", doc.split(heading, 1)[1], flags=re.MULTILINE)[0]


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_documented_with_its_signature(name):
    section(name)


@pytest.mark.parametrize("name", HOOKS)
def test_hook_parameters_are_typed_and_documented_with_their_types(name):
    text = section(name)
    for param in inspect.signature(getattr(hookspecs, name)).parameters.values():
        # The annotation as written in slr.hookspecs (a string: postponed evaluation).
        assert isinstance(param.annotation, str), f"annotate {name}'s parameter {param.name}"
        line = f"- `{param.name}` (`{param.annotation}`)"
        assert line in text, f"document {name}'s parameter as: {line}: ..."


@pytest.mark.parametrize("name", HOOKS)
def test_hook_has_an_example(name):
    blocks = re.findall(r"```python\n(.*?)```", section(name), flags=re.DOTALL)
    assert any(f"@hookimpl\ndef {name}(" in block for block in blocks), (
        f"add a ```python example implementing {name} under its heading in hooks.md"
    )


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_exercised_by_a_test(name):
    this = Path(__file__).resolve()
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]["testpaths"]
    files = (p for pattern in testpaths for d in ROOT.glob(pattern) for p in d.rglob("test_*.py"))
    for path in files:
        if path.resolve() != this and f"def {name}(" in path.read_text():
            return
    pytest.fail(
        f"no test implements the hook {name}; add one to the tests of the distribution that fires it"
    )
