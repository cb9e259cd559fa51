"""A token whose weights version the trainer never published is counted and logged."""

from __future__ import annotations

import structlog.testing

from slr.contracts import Segment, Trajectory, TrialResult
from slr.run.versions import METRIC, PublishedVersions


def trial(trial_id: str, versions: list[int], mask: list[int]) -> TrialResult:
    n = len(versions)
    seg = Segment(
        token_ids=list(range(n)), loss_mask=mask, logprobs=[0.0] * n, weights_versions=versions
    )
    return TrialResult(
        trial_id=trial_id,
        task_id="t",
        termination="completed",
        trajectory=Trajectory(session_id=trial_id, segments=[seg], num_calls=1),
    )


def test_policy_tokens_of_an_unpublished_version_are_counted_logged_and_reset_per_step():
    versions = PublishedVersions([0])
    versions.add(1)
    fine = trial("fine", [0, 0, 1, 1], [0, 1, 1, 1])
    # the prompt token's version (mask 0) is not a sampled token: only policy tokens count
    odd = trial("odd", [7, 1, 9, 9, 2], [0, 1, 1, 1, 1])
    with structlog.testing.capture_logs() as logs:
        assert versions.check([fine, odd]) == 3
    [warning] = logs
    assert warning["log_level"] == "warning" and warning["trial_id"] == "odd"
    assert warning["versions"] == {2: 1, 9: 2} and warning["published"] == [0, 1]
    assert versions.take() == {METRIC: 3}
    assert versions.take() == {METRIC: 0}  # counted once, in the step that saw it
    versions.add(2, 9)
    assert versions.check([odd]) == 0


def test_a_trial_without_a_trajectory_reports_nothing():
    versions = PublishedVersions([0])
    bare = TrialResult(trial_id="b", task_id="t", termination="completed")
    assert versions.check([bare]) == 0 and versions.take() == {METRIC: 0}
