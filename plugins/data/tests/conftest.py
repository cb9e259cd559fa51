"""A small real git repository for the data-preparation tests: code, pytest tests, fixes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click

OPS_V1 = '''\
"""Small arithmetic helpers."""


def add(a, b):
    return a + b


def clamp(value, low, high):
    if value < low:
        return low
    if value < high:
        return high
    return value
'''

OPS_V2 = OPS_V1.replace("    if value < high:\n", "    if value > high:\n")

OPS_V3 = (
    OPS_V2
    + """

def mean(values):
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / len(values)
"""
)

TESTS_V1 = """\
from calc.ops import add


def test_add():
    assert add(2, 3) == 5


def test_add_negative():
    assert add(-2, -3) == -5
"""

TESTS_V2 = (
    TESTS_V1
    + """

def test_clamp_inside():
    from calc.ops import clamp
    assert clamp(5, 0, 10) == 5


def test_clamp_edges():
    from calc.ops import clamp
    assert clamp(-1, 0, 10) == 0
    assert clamp(11, 0, 10) == 10
"""
)

TESTS_V3 = (
    TESTS_V2
    + """

def test_mean():
    from calc.ops import mean
    assert mean([1, 2, 3]) == 2
"""
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "PATH": "/usr/bin:/bin",
        },
    ).stdout


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


def build_repo(root: Path) -> dict[str, str]:
    """calc: v1 (clamp is wrong), a fix with its tests, a docs-only commit, a feature."""
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    shas = {}
    shas["v1"] = commit(
        root,
        {"calc/__init__.py": "", "calc/ops.py": OPS_V1, "tests/test_ops.py": TESTS_V1},
        "Add calc",
    )
    shas["fix"] = commit(
        root,
        {"calc/ops.py": OPS_V2, "tests/test_ops.py": TESTS_V2},
        "Fix clamp above the upper bound",
    )
    shas["docs"] = commit(root, {"README.md": "# calc\n"}, "Add a README")
    shas["feature"] = commit(
        root, {"calc/ops.py": OPS_V3, "tests/test_ops.py": TESTS_V3}, "Add mean"
    )
    return shas


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def calc_repo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("repos") / "calc"
    return root, build_repo(root)


@pytest.fixture
def slr_cli() -> click.Group:
    """The ``slr`` group as ``slr`` builds it: its own commands plus the plugins' (``data``,
    ``infer``) from the test's plugin manager, on a copy, so the module-level group stays as
    it was."""
    from slr.plugins import get_plugin_manager
    from slr_cli.main import cli

    group = click.Group("slr", commands=dict(cli.commands))
    get_plugin_manager().hook.register_commands(cli=group)
    return group
