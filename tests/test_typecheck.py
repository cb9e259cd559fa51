"""The whole tree type-checks: pyright (basic mode, configured in the root pyproject.toml)
over core, the CLI and every plugin distribution, with the development venv's packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pyright() -> list[str]:
    exe = Path(sys.executable).with_name("pyright")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("pyright")
    if found is None:
        pytest.fail("pyright is not installed: `bash scripts/setup` installs it into .venv")
    return [found]


@pytest.mark.slow
def test_pyright_reports_no_errors():
    # The PyPI wrapper ships pyright itself and runs it on the system's node; with the
    # warnings off it does not ask the package index whether a newer version exists.
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    proc = subprocess.run(
        [*pyright(), "--project", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = proc.stdout.strip().splitlines()[-1:] or [proc.stderr.strip()]
    assert proc.returncode == 0, f"pyright: {summary[0]}\n{proc.stdout}\n{proc.stderr}"


def test_every_distribution_is_type_checked():
    members = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "members.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pyright"]
    missing = [f"{m}/src" for m in members if f"{m}/src" not in config["include"]]
    assert not missing, f"add {missing} to [tool.pyright] include in pyproject.toml"
    stale = [
        p for p in config["include"] if p.endswith("/src") and p[: -len("/src")] not in members
    ]
    assert not stale, f"remove {stale} from [tool.pyright] include: no such distribution"
