"""`slr run` end to end on the embedded defaults: the loop, the run directory, resume.

The agent is the model-free ``oracle`` here (the loop's bookkeeping is what is under test);
tests/adapters runs real scaffolds through the same loop pieces.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from slr.run import checkpoints
from slr.run.directory import RunDir

ROOT = Path(__file__).resolve().parents[2]
SLR = str(Path(sys.executable).with_name("slr"))


def write_config(path: Path, model: Path, *, steps: int, n: int = 2) -> Path:
    path.write_text(
        f"""
[run]
name = "loop"
runs_dir = "{path.parent / "runs"}"
steps = {steps}
[tasks]
path = "{ROOT / "examples" / "tasks"}"
include = ["hello-world", "make-directory"]
[rollout]
tasks_per_step = 2
n_per_task = {n}
concurrency = 1
max_tokens = 8
[agent]
name = "oracle"
[backend]
name = "local"
[engine]
name = "hf"
model = "{model}"
"""
    )
    return path


def slr(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([SLR, *args], capture_output=True, text=True, timeout=600, **kw)


def only_run(runs: Path) -> RunDir:
    (path,) = [p for p in runs.iterdir() if p.is_dir()]
    return RunDir.open(path)


def run_and_kill_when(cfg: Path, runs: Path, reached, *, what: str) -> RunDir:
    """Start `slr run`, SIGKILL its whole process group once ``reached(run_path)``."""
    proc = subprocess.Popen(
        [SLR, "run", "-c", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300

    def ready() -> bool:
        return runs.exists() and any(runs.iterdir()) and reached(next(runs.iterdir()))

    while not ready():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.005)  # polling a file, not synchronising on time
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return only_run(runs)


def check_consistent(run: RunDir, *, steps: int, per_step: int) -> None:
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    trials = list(run.trials())
    assert len({t.trial_id for t in trials}) == len(trials)
    by_step = Counter(t.step for t in trials)
    assert by_step == {s: per_step for s in range(1, steps + 1)}
    for t in trials:
        assert t.group_id is not None and t.weights_version == t.step - 1
    assert checkpoints.latest_checkpoint(run) == checkpoints.checkpoint_dir(run, steps)


def resume_to_the_end(run: RunDir) -> RunDir:
    """`slr run --resume` a killed 3-step run: consistent, and every trial recorded before
    the kill kept byte for byte (none re-run)."""
    before = {p.name: p.read_bytes() for p in (run.path / "trials").glob("*.json")}
    res = slr("run", "--resume", str(run.path))
    assert res.returncode == 0, res.stderr[-3000:]
    run = RunDir.open(run.path)
    check_consistent(run, steps=3, per_step=4)
    after = {p.name: p.read_bytes() for p in (run.path / "trials").glob("*.json")}
    assert {k: after[k] for k in before} == before
    return run


@pytest.mark.slow
def test_run_then_resume_for_more_steps(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path / "run.toml", tiny_model_dir, steps=2)
    res = slr("run", "-c", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path / "runs")
    check_consistent(run, steps=2, per_step=4)
    assert all(m["reward/mean"] == 1.0 for m in run.metrics())

    text = run.config_text().replace("steps = 2", "steps = 3")
    (run.path / "config.toml").write_text(text)
    res = slr("run", "--resume", str(run.path))
    assert res.returncode == 0, res.stderr[-3000:]
    check_consistent(RunDir.open(run.path), steps=3, per_step=4)
    events = [e["event"] for e in RunDir.open(run.path).events()]
    assert events == ["started", "finished", "resumed", "started", "finished"]


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["mid-rollout", "checkpoint-written", "mid-update"])
def test_sigkill_then_resume_loses_nothing_counts_nothing_twice(tmp_path, tiny_model_dir, kill_at):
    cfg = write_config(tmp_path / "run.toml", tiny_model_dir, steps=3)

    def reached(path: Path) -> bool:
        if kill_at == "mid-rollout":  # a step-2 trial is recorded, the step is not done
            return any(path.glob("trials/s00002-*.json"))
        if kill_at == "mid-update":  # all of step 2's trials are recorded
            return len(list(path.glob("trials/s00002-*.json"))) == 4
        return checkpoints.is_complete(checkpoints.checkpoint_dir(path, 1))

    run = run_and_kill_when(cfg, tmp_path / "runs", reached, what=kill_at)
    run = resume_to_the_end(run)
    assert checkpoints.read_state(checkpoints.latest_checkpoint(run)).step == 3


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory) -> Path:
    """Wide enough (~25 M parameters, ~100 MB) that writing a checkpoint takes a while."""
    from slr_testkit import tiny

    model, tok = tiny.tiny_model(hidden=256, layers=1, heads=4, kv_heads=2)
    return tiny.save(model, tok, tmp_path_factory.mktemp("wide") / "model")


@pytest.mark.slow
def test_sigkill_mid_checkpoint_then_resume_from_the_previous_one(tmp_path, wide_model_dir):
    cfg = write_config(tmp_path / "run.toml", wide_model_dir, steps=3)

    def writing_step_2(path: Path) -> bool:
        # step 2's checkpoint is being written: its folder exists without COMPLETE
        final = checkpoints.checkpoint_dir(path, 2)
        partial = final.with_name(final.name + checkpoints.PARTIAL_SUFFIX)
        return partial.exists() or (final.exists() and not checkpoints.is_complete(final))

    run = run_and_kill_when(cfg, tmp_path / "runs", writing_step_2, what="the 2nd checkpoint")
    # the torn checkpoint does not count: resume starts after step 1
    assert checkpoints.latest_checkpoint(run) == checkpoints.checkpoint_dir(run, 1)
    # step 2's trials were made by step 1's weights, still the newest complete checkpoint
    run = resume_to_the_end(run)
    assert not list((run.path / "checkpoints").glob("*.partial"))
