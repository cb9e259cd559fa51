"""Harbor's run options on `slr run` and `slr eval` (-a, -e, -m, -n, -p, timeout multipliers),
through click's runner: what each sets, and the agent timeout multiplier on a real trial."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import slr.run.training
from slr.errors import UsageError
from slr_cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"


@pytest.fixture
def captured(monkeypatch):
    """`slr run` resolves the config and hands it to slr.run.training.train: keep it there."""
    seen = {}

    def train(cfg, *, resume, output=None):
        seen["cfg"], seen["resume"], seen["output"] = cfg, resume, output

    monkeypatch.setattr(slr.run.training, "train", train)
    return seen


def test_run_takes_harbors_short_options(captured):
    res = CliRunner().invoke(
        cli,
        [
            "run",
            "--skip-preflight",  # Org/Name is a name here, not a model on this machine
            "-a",
            "oracle",
            "-e",
            "local",
            "-m",
            "Org/Name",
            "-n",
            "3",
            "-p",
            str(EXAMPLES),
            "--agent-timeout-multiplier",
            "2.5",
        ],
    )
    assert res.exit_code == 0, res.output
    cfg = captured["cfg"]
    assert cfg.agent.name == "oracle" and cfg.backend.name == "local"
    assert cfg.engine.options.model == "Org/Name"
    assert cfg.rollout.concurrency == 3
    assert cfg.tasks.path == EXAMPLES
    assert cfg.rollout.agent_timeout_multiplier == 2.5
    assert cfg.verifier.options.timeout_multiplier == 1.0


def test_the_general_timeout_multiplier_scales_both_phases_unless_one_is_named(captured):
    res = CliRunner().invoke(
        cli,
        [
            "run",
            "--skip-preflight",
            "--timeout-multiplier",
            "3",
            "--verifier-timeout-multiplier",
            "0.5",
        ],
    )
    assert res.exit_code == 0, res.output
    cfg = captured["cfg"]
    assert cfg.rollout.agent_timeout_multiplier == 3.0
    assert cfg.verifier.options.timeout_multiplier == 0.5


@pytest.mark.parametrize("bad", ["0", "-1", "x"])
def test_a_bad_multiplier_is_refused_before_anything_starts(captured, bad):
    res = CliRunner().invoke(cli, ["run", "--agent-timeout-multiplier", bad])
    assert res.exit_code == 2 and "--agent-timeout-multiplier" in res.output
    assert "cfg" not in captured


def test_resume_refuses_harbors_options_too(captured, tmp_path):
    res = CliRunner().invoke(cli, ["run", "--resume", str(tmp_path), "-m", "Org/Name"])
    # raised for `slr`'s entry point to print and exit with (UsageError: 2)
    assert isinstance(res.exception, UsageError) and "-m" in str(res.exception)
    assert "cfg" not in captured


def _slow_task(tmp_path: Path) -> Path:
    """hello-world whose gold solution takes 2 s, under a 1 s agent timeout."""
    task = tmp_path / "tasks" / "slow-hello"
    shutil.copytree(EXAMPLES / "hello-world", task)
    solve = task / "solution" / "solve.sh"
    solve.write_text(solve.read_text() + "\nsleep 2\n")
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 120.0", "timeout_sec = 1.0"))
    assert "timeout_sec = 1.0" in toml.read_text()
    return task


@pytest.mark.timeout(120)
def test_the_agent_timeout_multiplier_decides_whether_a_real_trial_times_out(tmp_path):
    task = _slow_task(tmp_path)

    def eval_(*extra: str) -> dict:
        out = tmp_path / f"eval{len(extra)}"
        res = CliRunner().invoke(
            cli,
            [
                "eval",
                *("-a", "oracle", "-e", "local", "-p", str(task), "-n", "1"),
                *("--set", f"backend.cache_dir={json.dumps(str(tmp_path / 'cache'))}"),
                *("--output", str(out), "--json", *extra),
            ],
        )
        assert res.exit_code in (0, 1), res.output
        (trial,) = (out / "trials").glob("*.json")
        return json.loads(trial.read_text())

    timed_out = eval_()
    assert timed_out["termination"] == "agent_timeout"
    assert "1s" in timed_out["error"]
    scaled = eval_("--agent-timeout-multiplier", "10")
    assert scaled["termination"] == "completed", scaled.get("error")
    assert scaled["reward"]["value"] == 1.0
