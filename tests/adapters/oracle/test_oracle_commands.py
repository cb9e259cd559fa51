"""The oracle and nop agents, and `slr check-tasks` / `slr eval` run as a user runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from slr_adapter_oracle.agents import NopAgent, OracleAgent

from slr import hookimpl
from slr.errors import UsageError
from slr.testing import AgentAdapterTests

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "tasks"
SLR = str(Path(sys.executable).with_name("slr"))


class TestOracleConformance(AgentAdapterTests):
    @pytest.fixture
    def adapter(self):
        return OracleAgent()


class TestNopConformance(AgentAdapterTests):
    @pytest.fixture
    def adapter(self):
        return NopAgent()


def slr(*args, cwd):
    return subprocess.run([SLR, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture
def local_opts(tmp_path):
    return ["--backend", "local", "--backend-opt", f"cache_dir={tmp_path / 'cache'}"]


def test_check_tasks_passes_sound_tasks_and_fails_a_broken_one(tmp_path, local_opts):
    tasks = tmp_path / "tasks"
    shutil.copytree(EXAMPLES / "hello-world", tasks / "hello-world")
    shutil.copytree(EXAMPLES / "hello-world", tasks / "always-passes")
    # A task whose tests pass whatever the agent does: nop scores 1, so the check fails.
    (tasks / "always-passes" / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
    )
    good = slr("check-tasks", str(tasks / "hello-world"), *local_opts, cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert "hello-world" in good.stdout and "ok" in good.stdout
    both = slr("check-tasks", str(tasks), *local_opts, "--json", cwd=tmp_path)
    assert both.returncode == 1
    rows = {(r["task_id"], r["agent"]): r for r in json.loads(both.stdout)}
    assert rows[("always-passes", "nop")]["reward"]["value"] == 1.0
    assert rows[("hello-world", "nop")]["reward"]["value"] == 0.0


def test_eval_prints_rewards_and_records_a_run(tmp_path, local_opts):
    res = slr(
        "eval",
        "--agent",
        "oracle",
        "--tasks",
        str(EXAMPLES / "count-lines"),
        "-k",
        "2",
        *local_opts,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "count-lines" in res.stdout and "1.00" in res.stdout and "2×completed" in res.stdout
    (run,) = (tmp_path / "runs").iterdir()
    assert len(list((run / "trials").glob("*.json"))) == 2


def test_eval_with_an_unknown_agent_lists_the_installed_ones(tmp_path, local_opts):
    res = slr(
        "eval", "--agent", "no-such-agent", "--tasks", str(EXAMPLES), *local_opts, cwd=tmp_path
    )
    assert res.returncode == 2 and "unknown agent 'no-such-agent'" in res.stderr
    assert "oracle" in res.stderr


class _ModelAgent:
    protocol = "openai"


class _RegistersAModelAgent:
    @hookimpl
    def register_agents(self, register):
        register("needs-a-model", _ModelAgent)


def test_eval_refuses_an_agent_that_needs_a_model(slr_plugins, tmp_path):
    from slr_adapter_oracle.commands import eval_

    slr_plugins.register(_RegistersAModelAgent(), name="model-agent")
    res = CliRunner().invoke(
        eval_, ["--agent", "needs-a-model", "--tasks", str(EXAMPLES), "--backend", "local"]
    )
    assert isinstance(res.exception, UsageError)
    assert "calls a model" in str(res.exception)
