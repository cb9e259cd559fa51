"""The checkpoint layout (slr.run.checkpoints): written once, counted only when complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from slr.errors import UsageError
from slr.run import checkpoints
from slr.run.directory import RunDir


def test_a_checkpoint_is_written_whole_with_its_state_and_marker(tmp_path):
    run = RunDir.create(tmp_path, "exp", "")
    seen = []

    def save(path: Path) -> None:
        seen.append(path.name)
        assert not checkpoints.is_complete(path), "the marker is written after save"
        (path / "weights.bin").write_bytes(b"w")

    path = checkpoints.write_checkpoint(run, 3, save=save, metrics={"reward/mean": 0.5})
    assert seen == ["step-000003" + checkpoints.PARTIAL_SUFFIX]
    assert path == checkpoints.checkpoint_dir(run, 3) == run.path / "checkpoints" / "step-000003"
    assert sorted(p.name for p in path.iterdir()) == [
        checkpoints.COMPLETE,
        checkpoints.STATE,
        "weights.bin",
    ]
    state = checkpoints.read_state(path)
    assert (state.step, dict(state.metrics), state.servable_weights) == (
        3,
        {"reward/mean": 0.5},
        None,
    )
    assert not list((run.path / "checkpoints").glob("*" + checkpoints.PARTIAL_SUFFIX))


def test_a_failed_save_leaves_no_checkpoint(tmp_path):
    run = RunDir.create(tmp_path, "exp", "")
    checkpoints.write_checkpoint(run, 1, save=lambda p: None, metrics={})

    def broken(path: Path) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoints.write_checkpoint(run, 2, save=broken, metrics={})
    assert checkpoints.latest_checkpoint(run) == checkpoints.checkpoint_dir(run, 1)


def test_latest_checkpoint_ignores_incomplete_and_partial_folders(tmp_path):
    run = RunDir.create(tmp_path, "exp", "")
    for step in (1, 2, 3):
        checkpoints.write_checkpoint(run, step, save=lambda p: None, metrics={})
    (checkpoints.checkpoint_dir(run, 3) / checkpoints.COMPLETE).unlink()
    partial = run.path / "checkpoints" / ("step-000004" + checkpoints.PARTIAL_SUFFIX)
    partial.mkdir()
    (partial / checkpoints.COMPLETE).write_text("")
    assert checkpoints.latest_checkpoint(run) == checkpoints.checkpoint_dir(run, 2)
    assert checkpoints.latest_checkpoint(run.path) == checkpoints.checkpoint_dir(run, 2)
    with pytest.raises(UsageError, match="incomplete"):
        checkpoints.require_complete(checkpoints.checkpoint_dir(run, 3))
