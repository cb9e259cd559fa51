"""Which checkpoint `slr eval --checkpoint` serves, and the errors for paths that are none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slr.errors import UsageError
from slr.evaluation import resolve_checkpoint
from slr.runs import RunDir


def make_run(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path / "runs", "r", "[run]\n")


def make_checkpoint(run: RunDir, step: int, *, complete=True, policy=True) -> Path:
    path = run.checkpoint_dir(step)
    path.mkdir(parents=True)
    (path / "loop.json").write_text(json.dumps({"step": step, "metrics": {}}))
    if policy:
        (path / "policy").mkdir()
        (path / "policy" / "config.json").write_text("{}")
    if complete:
        (path / "COMPLETE").write_text("")
    return path


def test_a_run_folder_means_its_latest_complete_checkpoint(tmp_path):
    run = make_run(tmp_path)
    make_checkpoint(run, 1)
    second = make_checkpoint(run, 2)
    make_checkpoint(run, 3, complete=False)  # being written: not a candidate
    ckpt = resolve_checkpoint(run.path)
    assert (ckpt.path, ckpt.step, ckpt.run) == (second, 2, run.path)
    assert ckpt.policy == second / "policy"


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


def test_a_checkpoint_without_policy_weights_is_refused(tmp_path):
    path = make_checkpoint(make_run(tmp_path), 1, policy=False)
    with pytest.raises(UsageError, match=r"no policy/ model folder") as err:
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
