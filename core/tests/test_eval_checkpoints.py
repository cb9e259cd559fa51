"""Which checkpoint `slr eval --checkpoint` serves, and the errors for paths that are none."""

from __future__ import annotations

from pathlib import Path

import pytest

from slr.errors import UsageError
from slr.run import checkpoints
from slr.run.checkpoints import resolve_checkpoint
from slr.run.directory import RunDir


def make_run(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path / "runs", "r", "[run]\n")


class ModelFolderOptimizer:
    """Writes what an optimizer with servable weights writes: a model folder of its choice."""

    def __init__(self, weights: str | None = "weights"):
        self.weights = weights

    def save(self, path: Path) -> None:
        (path / "state.bin").write_bytes(b"x")
        if self.weights:
            (path / self.weights).mkdir()
            (path / self.weights / "config.json").write_text("{}")

    def servable_weights(self, path: Path) -> Path | None:
        return None if self.weights is None else path / self.weights


def make_checkpoint(run: RunDir, step: int, *, complete=True, weights="weights") -> Path:
    opt = ModelFolderOptimizer(weights)
    path = checkpoints.write_checkpoint(
        run, step, save=opt.save, metrics={}, servable_weights=opt.servable_weights
    )
    if not complete:  # as a kill between the rename and the marker leaves it
        (path / checkpoints.COMPLETE).unlink()
    return path


def test_a_run_folder_means_its_latest_complete_checkpoint(tmp_path):
    run = make_run(tmp_path)
    make_checkpoint(run, 1)
    second = make_checkpoint(run, 2)
    make_checkpoint(run, 3, complete=False)  # being written: not a candidate
    ckpt = resolve_checkpoint(run.path)
    assert (ckpt.path, ckpt.step, ckpt.run) == (second, 2, run.path)
    # where the weights are is the optimizer's to say, not a fixed folder name
    assert ckpt.weights == second / "weights"


def test_a_checkpoint_folder_is_taken_as_is(tmp_path):
    run = make_run(tmp_path)
    first = make_checkpoint(run, 1)
    make_checkpoint(run, 2)
    ckpt = resolve_checkpoint(first)
    assert (ckpt.path, ckpt.step, ckpt.run) == (first, 1, run.path)


def test_an_incomplete_checkpoint_is_refused_and_the_complete_one_named(tmp_path):
    run = make_run(tmp_path)
    done = make_checkpoint(run, 1)
    partial = make_checkpoint(run, 2, complete=False)
    with pytest.raises(UsageError, match="no COMPLETE marker") as err:
        resolve_checkpoint(partial)
    assert str(partial) in str(err.value) and str(done) in str(err.value)


def test_a_checkpoint_without_servable_weights_is_refused(tmp_path):
    path = make_checkpoint(make_run(tmp_path), 1, weights=None)
    with pytest.raises(UsageError, match=r"names no servable weights") as err:
        resolve_checkpoint(path)
    assert str(path) in str(err.value)


def test_a_run_without_checkpoints_and_a_missing_path_are_refused(tmp_path):
    run = make_run(tmp_path)
    with pytest.raises(UsageError, match="no complete checkpoint yet"):
        resolve_checkpoint(run.path)
    with pytest.raises(UsageError, match="is not a folder; pass a checkpoint folder"):
        resolve_checkpoint(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="not a complete checkpoint"):
        resolve_checkpoint(tmp_path)  # a folder that is neither
