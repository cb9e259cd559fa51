"""`slr preflight`, and the preflight `slr run` / `slr eval` pass first, run as a user runs
them: the installed console script in a subprocess."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

SLR = str(Path(sys.executable).with_name("slr"))
TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def slr(*args: str, cwd: Path):
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [SLR, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


def cpu_seconds_of(fn):
    """``fn()``'s result and the CPU seconds its child processes used. The budget (a
    refusal in under 10 s) is asserted on CPU time, which a machine shared with other jobs
    does not inflate the way it inflates wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = fn()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def write(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f'[run]\nruns_dir = "{tmp_path / "runs"}"\n'
        f'[tasks]\npath = "{TASKS}"\n'
        f"[rollout]\nconcurrency = 2\n{extra}\n"
        '[agent]\nname = "nop"\n[backend]\nname = "local"\n'
    )
    return cfg


@pytest.mark.timeout(120)
def test_preflight_prints_one_line_per_check_and_passes(tmp_path):
    res = slr("preflight", "-c", str(write(tmp_path)), "--for", "eval", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout.splitlines()
    for check in ("plugins", "pitfalls", "local-isolation", "disk", "memory", "tasks"):
        assert any(line.split()[1] == f"{check}:" for line in out), res.stdout
    assert all(line.split()[0] in {"pass", "warn"} for line in out[:-1])
    assert out[-1].startswith("preflight: ") and "0 fatal" in out[-1]


@pytest.mark.timeout(120)
def test_preflight_exits_non_zero_on_a_fatal_with_its_fix(tmp_path):
    cfg = write(tmp_path, "n_per_task = 1")
    res = slr("preflight", "-c", str(cfg), "--structure-only", cwd=tmp_path)
    assert res.returncode == 1
    [fatal] = [line for line in res.stdout.splitlines() if line.startswith("fatal")]
    assert "pitfalls: rollout.n_per_task = 1" in fatal and ". Fix: " in fatal
    assert "docs/troubleshooting/training.md#reward-never-moves" in fatal


@pytest.mark.timeout(120)
def test_an_unresolvable_config_is_a_fatal_line_not_a_traceback(tmp_path):
    res = slr("preflight", "--agent", "no-such-agent", cwd=tmp_path)
    assert res.returncode == 1
    assert res.stdout.startswith("fatal  config: unknown agent 'no-such-agent'")
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.timeout(60)
def test_run_on_a_tripping_config_stops_before_anything_starts(tmp_path):
    cfg = write(tmp_path, "temperature = 0.0")
    res, took = cpu_seconds_of(lambda: slr("run", "-c", str(cfg), cwd=tmp_path))
    assert res.returncode == 2, res.stderr
    assert took < 10, f"slr run took {took:.1f}s to refuse a tripping config"
    assert "fatal  pitfalls: rollout.temperature = 0" in res.stderr
    assert "nothing was started" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, so no engine or sandbox


@pytest.mark.timeout(60)
def test_run_on_k8s_without_credentials_is_one_line_before_anything_starts(tmp_path):
    # The new-user case: a cluster slr cannot reach. No model is loaded (the data
    # stage does not run after a fatal machine check) and no run directory is made.
    cfg = write(tmp_path)
    res, took = cpu_seconds_of(
        lambda: slr(
            "run", "-c", str(cfg), "--backend", "k8s",
            "--set", f'backend.kubeconfig="{tmp_path / "kubeconfig"}"',
            cwd=tmp_path,
        )
    )  # fmt: skip
    assert took < 10, f"slr run took {took:.1f} CPU seconds to refuse"
    assert res.returncode == 2
    fatal = [line for line in res.stderr.splitlines() if line.startswith("fatal")]
    assert any(line.startswith("fatal  k8s-api: no kubeconfig at") for line in fatal)
    # and the image path: the containerd socket this machine lacks
    assert any(line.startswith("fatal  k8s-images: image_load = 'containerd'") for line in fatal)
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(60)
def test_a_start_up_failure_past_the_preflight_is_one_line_too(tmp_path):
    # Without the preflight the same failure happens while the rollout starts: it still
    # reaches the user as one line with its fix, not a traceback.
    res = slr(
        "eval", "--agent", "nop", "--backend", "k8s", "--tasks", str(TASKS),
        "--set", f'backend.kubeconfig="{tmp_path / "kubeconfig"}"',
        "--set", f'run.runs_dir="{tmp_path / "runs"}"', "--skip-preflight",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 1
    assert "Traceback" not in res.stderr, res.stderr
    [error] = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert "no kubeconfig at" in error and "docs/troubleshooting/README.md" in error


@pytest.mark.timeout(60)
def test_eval_of_a_checkpoint_warns_of_a_temperature_other_than_training(tmp_path):
    run = tmp_path / "runs" / "trained-1"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text("[rollout]\ntemperature = 1.0\n")
    res = slr(
        "eval", "-c", str(write(tmp_path)), "--checkpoint", str(run),
        "--set", "rollout.temperature=0.2", cwd=tmp_path,
    )  # fmt: skip
    warned = [line for line in res.stderr.splitlines() if line.startswith("warn   pitfalls:")]
    assert len(warned) == 1 and "trained at 1" in warned[0], res.stderr
    assert "Traceback" not in res.stderr
    # the same check ahead of time
    res = slr(
        "preflight", "-c", str(write(tmp_path)), "--for", "eval", "--structure-only",
        "--checkpoint", str(run), "--set", "rollout.temperature=0.2", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0 and "warn   pitfalls: " in res.stdout, res.stdout + res.stderr


@pytest.mark.timeout(60)
def test_infer_gates_on_the_preflight_like_eval(tmp_path):
    # the same gate as `slr eval`: a fatal check (here, a folder with no task in it) stops
    # `slr infer` before its run folder, an engine or a sandbox exists
    out = tmp_path / "inf"
    (tmp_path / "no-tasks").mkdir()
    res = slr(
        "infer", "-c", str(write(tmp_path)), "-p", str(tmp_path / "no-tasks"),
        "--output", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "fatal  tasks: " in res.stderr and "nothing was started" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()


@pytest.mark.timeout(60)
def test_run_output_into_a_used_folder_is_refused_before_the_preflight(tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    res = slr("run", "-c", str(write(tmp_path)), "--output", str(used), cwd=tmp_path)
    assert res.returncode == 2
    assert "exists and is not empty" in res.stderr and "preflight:" not in res.stderr
    assert sorted(p.name for p in used.iterdir()) == ["keep.txt"]
