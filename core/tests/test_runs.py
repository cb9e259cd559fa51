"""The run directory: atomic writes, durable appends, torn tails, no trial twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from slr.contracts import Reward, Segment, TerminationReason, Trajectory, TrialResult
from slr.errors import UsageError
from slr.run.directory import RunDir, atomic_write


def _trial(tid: str, reward: float | None = 1.0, term="completed") -> TrialResult:
    return TrialResult(
        trial_id=tid,
        task_id="hello",
        termination=term,
        reward=None if reward is None else Reward(value=reward, details={"tests": 3}),
        trajectory=Trajectory(
            session_id="s",
            segments=[Segment(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0, -0.5, -1.0])],
        ),
    )


def test_create_lays_out_the_run(tmp_path):
    run = RunDir.create(tmp_path, "exp", "x = 1\n")
    assert run.id.startswith("exp-")
    assert (run.path / "trials").is_dir() and (run.path / "checkpoints").is_dir()
    assert run.config_text() == "x = 1\n"
    again = RunDir.create(tmp_path, "exp", "")
    assert again.path != run.path  # same second: a suffix, never a shared folder


def test_trials_round_trip_and_are_never_recorded_twice(tmp_path):
    run = RunDir.create(tmp_path, "exp", "")
    run.write_trial(_trial("t1"))
    run.write_trial(_trial("t2", reward=None, term="sandbox_error"))
    with pytest.raises(FileExistsError, match="t1 is already recorded"):
        run.write_trial(_trial("t1"))
    trials = {t.trial_id: t for t in RunDir.open(run.path).trials()}
    assert trials["t1"] == _trial("t1")
    assert trials["t2"].termination is TerminationReason.SANDBOX_ERROR
    assert not trials["t2"].trainable and trials["t1"].trainable
    assert run.trial_ids() == {"t1", "t2"}


def test_metrics_and_events_append(tmp_path):
    run = RunDir.create(tmp_path, "exp", "")
    run.append_metrics(1, {"reward_mean": 0.25})
    run.append_event("started", resumed=False)
    run.sync()
    assert RunDir.open(run.path).metrics() == [{"step": 1, "reward_mean": 0.25}]
    assert RunDir.open(run.path).events()[0]["event"] == "started"


def test_torn_tail_is_skipped_and_repaired(tmp_path):
    run = RunDir.create(tmp_path, "exp", "")
    run.append_metrics(1, {"a": 1})
    run.close()
    with (run.path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 2, "a"')  # a writer killed mid-line
    assert [m["step"] for m in RunDir(run.path).metrics()] == [1]
    reopened = RunDir.open(run.path)  # repairs the tail
    reopened.append_metrics(2, {"a": 2})
    reopened.close()
    assert [m["step"] for m in RunDir.open(run.path).metrics()] == [1, 2]


def test_open_rejects_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(UsageError, match="is not a run directory"):
        RunDir.open(tmp_path)


def test_atomic_write_survives_a_kill_mid_write(tmp_path):
    """A process killed while rewriting a file leaves the old content, never a torn one."""
    target = tmp_path / "state.json"
    atomic_write(target, json.dumps({"v": "old"}))
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        import slr.run.directory as runs
        real_fsync = os.fsync
        def stall(fd):
            print("writing", flush=True)
            sys.stdin.read()  # block here until killed, mid-write
        os.fsync = stall
        runs.atomic_write(Path({str(target)!r}), "x" * 10_000_000)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads(target.read_text()) == {"v": "old"}


def test_follow_reads_each_appended_line_once_and_waits_for_a_torn_one(tmp_path):
    run = RunDir.create(tmp_path, "r", "x = 1\n")
    run.append_metrics(1, {"loss": 0.5})
    records, at = run.follow(RunDir.METRICS)
    assert [r["step"] for r in records] == [1]
    assert run.follow(RunDir.METRICS, at) == ([], at)
    run.append_metrics(2, {"loss": 0.4})
    with (run.path / RunDir.METRICS).open("a") as fh:
        fh.write('{"step": 3, "lo')  # a writer mid-append
    records, at = run.follow(RunDir.METRICS, at)
    assert [r["step"] for r in records] == [2]
    with (run.path / RunDir.METRICS).open("a") as fh:
        fh.write('ss": 0.3}\n')
    records, _ = run.follow(RunDir.METRICS, at)
    assert records == [{"step": 3, "loss": 0.3}]


def test_watch_reads_a_live_run_without_touching_it(tmp_path):
    run = RunDir.create(tmp_path, "r", "x = 1\n")
    (run.path / RunDir.EVENTS).write_text('{"event": "started"}\n{"event": "fini')
    before = (run.path / RunDir.EVENTS).read_bytes()
    watched = RunDir.watch(run.path)
    assert [e["event"] for e in watched.events()] == ["started"]
    assert (run.path / RunDir.EVENTS).read_bytes() == before  # open() would cut the tail
    with pytest.raises(UsageError, match="not a run directory"):
        RunDir.watch(tmp_path)


def test_follow_goes_on_past_a_line_that_is_not_a_record(tmp_path):
    run = RunDir.create(tmp_path, "r", "x = 1\n")
    (run.path / RunDir.METRICS).write_text('{"step": 1}\nnot json\n[2]\n{"step": 2}\n')
    records, at = run.follow(RunDir.METRICS)
    assert records == [{"step": 1}, {"step": 2}]
    assert at == (run.path / RunDir.METRICS).stat().st_size


# -- a full disk -----------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (the tests run as root, as CI does); a filler file takes all of it."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "slr-test", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk) -> os.PathLike:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


@pytest.mark.timeout(30)
def test_a_full_disk_waits_for_space_then_records_whole(small_disk, monkeypatch):
    """Writes that find the disk full wait (the run goes on once there is space) instead of
    failing the run; the line cut short by the full disk is finished, not duplicated, and
    the run notes how long it waited. Without the wait, the first write raised ENOSPC."""
    import slr.run.directory as runs

    run = RunDir.create(small_disk, "exp", "x = 1\n")
    run.append_metrics(1, {"loss": 0.5})
    filler = _fill(small_disk)
    waits = []

    def free_on_first_wait(seconds):
        # the writer is waiting for space: now free it (what an operator would do)
        waits.append(seconds)
        if filler.exists():
            filler.unlink()

    monkeypatch.setattr(runs, "_pause", free_on_first_wait, raising=False)
    run.write_trial(_trial("t-0"))
    _fill(small_disk)
    run.append_metrics(2, {"loss": 0.25, "pad": "x" * 5000})
    run.close()

    again = RunDir.open(run.path)
    assert again.trial("t-0") == _trial("t-0")
    assert [m["step"] for m in again.metrics()] == [1, 2]
    full = [e for e in again.events() if e["event"] == "disk_full"]
    assert [e["file"] for e in full] == ["trials/t-0.json", "metrics.jsonl"]
    assert len(waits) >= 2
    assert not list((run.path / "trials").glob(".*.tmp")), "a temporary file was left"


@pytest.mark.timeout(30)
def test_a_disk_that_stays_full_stops_with_a_clear_error(small_disk, monkeypatch):
    import slr.run.directory as runs

    run = RunDir.create(small_disk, "exp", "x = 1\n")
    _fill(small_disk)
    monkeypatch.setattr(runs, "DISK_FULL_WAIT_S", 0.2)
    with pytest.raises(runs.DiskFull, match=r"full for 0.2 s; free space on it .* --resume"):
        run.write_trial(_trial("t-0"))
    assert not run.has_trial("t-0")
    assert not list((run.path / "trials").glob(".*.tmp")), "a temporary file was left"


@pytest.mark.timeout(60)
def test_a_checkpoint_on_a_full_disk_waits_and_starts_over(small_disk, monkeypatch):
    """torch's ``save`` loses the reason (a bare RuntimeError); the checkpoint still waits
    for space, starts over from nothing, and is complete and loadable afterwards."""
    import torch

    import slr.run.directory as runs
    from slr.run import checkpoints

    run = RunDir.create(small_disk, "exp", "x = 1\n")
    filler = _fill(small_disk)
    monkeypatch.setattr(runs, "_pause", lambda s: filler.unlink(missing_ok=True), raising=False)

    def save(folder):
        torch.save({"w": torch.arange(50_000, dtype=torch.float32)}, folder / "w.pt")

    path = runs.wait_for_space(
        lambda: checkpoints.write_checkpoint(run, 1, save=save, metrics={"loss": 1.0}),
        checkpoints.checkpoint_dir(run, 1),
    )
    assert checkpoints.latest_checkpoint(run) == path
    assert torch.load(path / "w.pt")["w"][-1] == 49_999
