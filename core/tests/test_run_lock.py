"""``run.lock``: one live writer per run directory, a second refused by name, readers told
who holds it, and a killed holder leaves no stale lock."""

from __future__ import annotations

import os

import pytest

from slr.run.directory import RunDir, RunInUse
from slr_testkit.runs import held_by_another_process


@pytest.fixture
def run(tmp_path) -> RunDir:
    return RunDir.create(tmp_path / "runs", "lock", "[run]\n")


@pytest.mark.timeout(60)
def test_a_second_writer_is_refused_naming_the_first_and_a_kill_frees_the_run(run):
    assert run.holder() is None
    with held_by_another_process(run.path) as proc:
        held = run.holder()
        assert held is not None and held["pid"] == proc.pid
        with pytest.raises(RunInUse, match=f"in flight in another process \\(pid {proc.pid} on"):
            RunDir.open(run.path).hold()
    # killed: the kernel dropped the lock with its process, nothing stale to clean up
    assert run.holder() is None
    again = RunDir.open(run.path)
    again.hold()
    assert again.holder()["pid"] == os.getpid()
    again.close()
    assert run.holder() is None


@pytest.mark.timeout(60)
def test_a_reader_leaves_a_live_writers_half_written_line_alone(run):
    with held_by_another_process(run.path):
        (run.path / RunDir.METRICS).write_text('{"step": 1}\n{"step": 2, "rew')
        RunDir.open(run.path)  # `slr status` while the run is going
        assert (run.path / RunDir.METRICS).read_text().endswith('"rew')
    RunDir.open(run.path)  # nobody writes it now: the torn tail is repaired
    assert (run.path / RunDir.METRICS).read_text() == '{"step": 1}\n'


def test_output_must_be_a_new_folder(tmp_path):
    made = RunDir.create_at(tmp_path / "mine", "[run]\n")
    assert (made.path / RunDir.CONFIG).is_file() and (made.path / "trials").is_dir()
    with pytest.raises(Exception, match="exists and is not empty.*slr run --resume"):
        RunDir.create_at(tmp_path / "mine", "[run]\n")
