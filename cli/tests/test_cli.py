"""The ``slr`` command, run as a user runs it: a subprocess of the installed console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SLR = str(Path(sys.executable).with_name("slr"))


def slr(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [SLR, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=120
    )


def test_version():
    res = slr("--version")
    assert res.returncode == 0
    assert res.stdout.startswith("slr 0.")


def test_help_teaches_the_commands():
    res = slr("--help")
    assert res.returncode == 0
    for word in ("run", "plugins", "config", "new"):
        assert word in res.stdout


def test_plugins_lists_the_cores_own_plugins_even_with_no_entry_points_loaded():
    res = slr("plugins", "--json", env={"SLR_LOAD_PLUGINS": ""})
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert {r["distribution"] for r in rows} == {"slr-core"} and all(r["version"] for r in rows)
    registers = {kind: names for r in rows for kind, names in r["registers"].items()}
    assert registers == {"agent": ["oracle", "nop"], "tool_parser": ["hermes"]}


def test_unknown_agent_exits_2_with_installed_names_and_install_hint():
    res = slr("run", "--agent", "nope")
    assert res.returncode == 2, res.stderr
    assert "unknown agent 'nope'" in res.stderr
    assert "Installed agents:" in res.stderr
    assert "pip install slr-adapter-nope" in res.stderr


def test_bad_set_value_exits_2_naming_key_and_value():
    res = slr("config", "show", "--set", "rollout.n_per_task=lots", env={"SLR_LOAD_PLUGINS": ""})
    assert res.returncode == 2
    assert "'lots'" in res.stderr and "n_per_task" in res.stderr


def test_config_reference_prints_markdown():
    res = slr("config", "reference")
    assert res.returncode == 0
    assert "## [rollout]" in res.stdout and "`n_per_task`" in res.stdout


def test_new_adapter_rejects_bad_names(tmp_path):
    res = slr("new", "adapter", "Bad_Name", "--dest", str(tmp_path))
    assert res.returncode == 2
    assert "is not valid" in res.stderr


@pytest.mark.slow
def test_adapter_from_template_is_found_through_real_entry_points(tmp_path):
    """Built from the template, installed as a real distribution, found by entry point."""
    assert slr("new", "adapter", "echo-agent", "--dest", str(tmp_path)).returncode == 0
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         str(tmp_path / "slr-adapter-echo-agent")],
        check=True, timeout=300,
    )  # fmt: skip
    env = {"PYTHONPATH": str(site)}
    res = slr("plugins", "--json", env=env)
    assert res.returncode == 0, res.stderr
    rows = {r["plugin"]: r for r in json.loads(res.stdout)}
    assert rows["echo-agent"]["distribution"] == "slr-adapter-echo-agent"
    assert rows["echo-agent"]["version"] == "0.1.0"
    assert rows["echo-agent"]["registers"] == {"agent": ["echo-agent"]}

    # its options are validated by the config class it registered
    shown = slr(
        "config", "show", "--agent", "echo-agent", "--set", "agent.command=echo hi", env=env
    )
    if shown.returncode == 0:
        assert 'command = "echo hi"' in shown.stdout
    else:  # the agent section passed; a later section's default plugin is not installed
        assert "unknown" in shown.stderr and "agent" not in shown.stderr.split("'")[0]
    bad = slr("config", "show", "--agent", "echo-agent", "--set", "agent.comand=x", env=env)
    assert bad.returncode == 2
    assert "agent.'comand'" in bad.stderr and "Did you mean 'command'" in bad.stderr

    # the allowlist can exclude it
    res = slr("plugins", "--json", env={**env, "SLR_LOAD_PLUGINS": "nothing-else"})
    assert "echo-agent" not in {r["plugin"] for r in json.loads(res.stdout)}

    # its own conformance test passes
    test = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(tmp_path / "slr-adapter-echo-agent" / "tests")],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=300,
    )  # fmt: skip
    assert test.returncode == 0, test.stdout + test.stderr


def test_status_reads_the_run_directory(tmp_path):
    from slr.contracts import Reward, TrialResult
    from slr.run.directory import RunDir

    run = RunDir.create(tmp_path, "exp", "")
    run.write_trial(
        TrialResult(trial_id="a", task_id="t", termination="completed", reward=Reward(value=1.0))
    )
    run.write_trial(
        TrialResult(trial_id="b", task_id="t", termination="completed", reward=Reward(value=0.0))
    )
    run.write_trial(TrialResult(trial_id="c", task_id="t", termination="sandbox_error"))
    run.append_metrics(1, {"reward_mean": 0.5})
    run.close()
    res = slr("status", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["steps_done"] == 1 and info["trials"] == 3
    assert info["terminations"] == {"completed": 2, "sandbox_error": 1}
    assert info["reward_mean"] == 0.5  # the sandbox_error trial is not scored
    # the folder of runs: its newest run
    assert json.loads(slr("status", str(tmp_path), "--json").stdout)["path"] == str(run.path)
    (tmp_path / "empty").mkdir()
    bad = slr("status", str(tmp_path / "empty"))
    assert bad.returncode == 2 and "neither a run directory nor a folder of runs" in bad.stderr


def test_run_ray_address_is_validated_before_anything_starts():
    res = slr("run", "--ray-address", "not an address", env={"SLR_LOAD_PLUGINS": ""})
    assert res.returncode == 2, res.stderr
    assert "run.ray_address" in res.stderr and "'not an address'" in res.stderr
