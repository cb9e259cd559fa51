"""Every hook is documented with its exact signature, and exercised by some test."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from slr import hookspecs

ROOT = Path(__file__).resolve().parents[2]
HOOKS = [
    name
    for name, fn in vars(hookspecs).items()
    if inspect.isfunction(fn) and hasattr(fn, "slr_spec")
]


def test_there_are_hooks():
    assert {"register_agents", "on_trial_finished", "register_commands"} <= set(HOOKS)


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_documented_with_its_signature(name):
    params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
    doc = (ROOT / "docs" / "plugins" / "hooks.md").read_text()
    assert f"### `{name}({params})`" in doc, f"document `{name}({params})` in docs/plugins/hooks.md"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_exercised_by_a_test(name):
    this = Path(__file__).resolve()
    for path in (ROOT / "tests").rglob("test_*.py"):
        if path.resolve() != this and f"def {name}(" in path.read_text():
            return
    pytest.fail(f"no test implements the hook {name}; add one under tests/")
