"""Every distribution ships ``py.typed``, so type checkers read its annotations."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = subprocess.run(
    [sys.executable, str(ROOT / "scripts" / "members.py")],
    capture_output=True,
    text=True,
    check=True,
).stdout.split()


def packages(member: str) -> list[str]:
    meta = tomllib.loads((ROOT / member / "pyproject.toml").read_text())
    return meta["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]


@pytest.mark.parametrize("member", MEMBERS)
def test_each_package_has_py_typed(member):
    for package in packages(member):
        assert (ROOT / member / package / "py.typed").is_file(), f"add {member}/{package}/py.typed"


@pytest.mark.slow
def test_py_typed_is_in_the_wheel(tmp_path):
    # One distribution stands for all: they share the build backend and its file selection.
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT / "core")],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    assert "slr/py.typed" in zipfile.ZipFile(wheel).namelist()
