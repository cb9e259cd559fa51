"""A user's first minutes: a fresh venv, `pip install ./core ./cli`, then one adapter."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _workspace_folders() -> dict[str, Path]:
    """Distribution name -> folder, for every distribution in this repository."""
    out = {}
    for pyproject in [
        ROOT / "core" / "pyproject.toml",
        ROOT / "cli" / "pyproject.toml",
        *sorted(ROOT.glob("*/*/pyproject.toml")),
    ]:
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        out[name] = pyproject.parent
    return out


def _local_closure(names: list[str]) -> list[Path]:
    """The folders of ``names`` and of every slr distribution they depend on, here."""
    folders = _workspace_folders()
    todo, seen = list(names), {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = folders[name]
        deps = tomllib.loads((folders[name] / "pyproject.toml").read_text())["project"].get(
            "dependencies", []
        )
        for dep in deps:
            dep_name = dep.split(";")[0].split("[")[0]
            for sep in "=<>!~ ":
                dep_name = dep_name.split(sep)[0]
            if dep_name in folders:
                todo.append(dep_name)
    return list(seen.values())


@pytest.mark.slow
def test_fresh_venv_install_list_and_uninstall_an_adapter(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "-c", str(ROOT / "scripts" / "constraints.txt")]
    subprocess.run([*pip, *map(str, _local_closure(["slr-core", "slr"]))], check=True, timeout=900)

    slr = str(env_dir / "bin" / "slr")
    gen = subprocess.run([slr, "new", "adapter", "hello", "--dest", str(tmp_path)], timeout=60)
    assert gen.returncode == 0
    subprocess.run([*pip, str(tmp_path / "slr-adapter-hello")], check=True, timeout=300)

    def listed() -> dict:
        res = subprocess.run(
            [slr, "plugins", "--json"], capture_output=True, text=True, timeout=60, check=True
        )
        return {r["plugin"]: r for r in json.loads(res.stdout)}

    rows = listed()
    # the core's own plugins: the model-free agents (with their empty bundle folder in the
    # wheel) and the hermes tool parser
    core = [r for r in rows.values() if r["distribution"] == "slr-core"]
    registers = {kind: names for r in core for kind, names in r["registers"].items()}
    assert registers == {"agent": ["oracle", "nop"], "tool_parser": ["hermes"]}
    bundle = subprocess.run(
        [py, "-c", "from slr.agents.model_free import NopAgent; print(NopAgent().bundle().path)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert Path(bundle.stdout.strip()).is_dir()
    assert rows["hello"]["distribution"] == "slr-adapter-hello"
    assert rows["hello"]["version"] == "0.1.0"

    subprocess.run([py, "-m", "pip", "uninstall", "-q", "-y", "slr-adapter-hello"], check=True)
    assert "hello" not in listed()
    assert sys.prefix != str(env_dir)  # the test's own environment was never touched
