"""A trial record carries its compactions and sub-agents, read off its segment tree."""

from __future__ import annotations

import json

import attrs

from slr.contracts import Reward, Segment, Trajectory, TrialResult
from slr.contracts.serialize import decode, encode, from_dict, to_dict


def _segments(*branches: str | None) -> list[Segment]:
    root = Segment(token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], logprobs=[0, 0, -1, -1])
    out = [root]
    for kind in branches:
        out.append(
            Segment(
                token_ids=[1, 2, 9],
                loss_mask=[0, 0, 1],
                logprobs=[0, 0, -1],
                parent=0,
                branch_at=2,
                branch=kind,  # type: ignore[arg-type]
            )
        )
    return out


def _trial(segments) -> TrialResult:
    return TrialResult(
        trial_id="t",
        task_id="task",
        termination="completed",
        reward=Reward(value=1.0),
        trajectory=Trajectory(session_id="t", segments=segments),
    )


def test_the_counts_follow_the_trajectory_and_reach_the_file():
    trial = _trial(_segments("rewrite", "fork", "rewrite"))
    assert (trial.compactions, trial.subagents) == (2, 1)
    on_disk = json.loads(encode(trial))
    assert (on_disk["compactions"], on_disk["subagents"]) == (2, 1)
    assert decode(encode(trial), TrialResult) == trial
    # derived, never stale: a new trajectory brings its own counts
    evolved = attrs.evolve(trial, trajectory=Trajectory(session_id="t", segments=_segments()))
    assert (evolved.compactions, evolved.subagents) == (0, 0)


def test_records_without_the_counts_or_a_trajectory_read_as_before():
    trial = _trial(_segments("fork"))
    old = to_dict(trial)
    old.pop("compactions", None)
    old.pop("subagents", None)
    assert from_dict(old, TrialResult).subagents == 1
    bare = TrialResult(trial_id="x", task_id="task", termination="sandbox_error")
    assert (bare.compactions, bare.subagents) == (0, 0)
    assert decode(encode(bare), TrialResult) == bare
