"""pass@k: the unbiased estimator against hand-computed values, and the eval summary."""

from __future__ import annotations

import pytest

from slr.contracts import Reward, TrialResult
from slr.run.passk import pass_at_k, summarize


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),  # nothing passed
        (4, 0, 4, 0.0),
        (4, 4, 1, 1.0),  # everything passed
        (4, 4, 4, 1.0),
        (4, 1, 1, 1 / 4),  # pass@1 is the success rate
        (10, 3, 1, 3 / 10),
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (4, 2, 2, 1 - 1 / 6),  # 1 - C(2,2)/C(4,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (5, 3, 3, 1.0),  # n - c < k: every draw of 3 holds a success
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(2, 1, 3), (0, 0, 1), (4, 1, 0), (3, 4, 1), (3, -1, 1)])
def test_pass_at_k_refuses_impossible_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass@k|successes"):
        pass_at_k(n, c, k)


def trial(task: str, i: int, reward: float | None, termination: str = "completed") -> TrialResult:
    return TrialResult(
        trial_id=f"{task}-{i}",
        task_id=task,
        termination=termination,
        reward=None if reward is None else Reward(value=reward),
    )


def test_summary_counts_tasks_and_leaves_infrastructure_failures_out_of_n():
    trials = [
        trial("a", 0, 1.0),
        trial("a", 1, 0.0),
        trial("a", 2, 0.0, "agent_timeout"),  # the policy's fault: scored 0
        trial("a", 3, None, "sandbox_error"),  # infra: not in n
        trial("b", 0, 1.0),
        trial("b", 1, None, "broken_task"),
        trial("b", 2, 0.5),  # below the threshold
        trial("b", 3, 1.0),
    ]
    s = summarize(trials, k=4, task_ids=["a", "b", "c"])
    a, b, c = s["tasks"]["a"], s["tasks"]["b"], s["tasks"]["c"]
    assert (a["n"], a["successes"], a["infra_failures"]) == (3, 1, 1)
    assert (b["n"], b["successes"], b["infra_failures"]) == (3, 2, 1)
    assert (c["n"], c["successes"]) == (0, 0)  # no trials at all: counted in no average
    assert a["pass_at"] == {
        "1": pytest.approx(1 / 3),
        "2": pytest.approx(2 / 3),
        "3": 1.0,
        "4": None,
    }
    assert b["pass_at"]["1"] == pytest.approx(2 / 3)
    assert b["mean_reward"] == pytest.approx(2.5 / 3)
    assert s["pass_at"]["1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert s["pass_at"]["4"] is None and s["tasks_counted"] == {"1": 2, "2": 2, "3": 2, "4": 0}
    assert (s["trials"], s["scored"], s["successes"], s["infra_failures"]) == (8, 6, 3, 2)
    assert s["terminations"] == {
        "completed": 5,
        "agent_timeout": 1,
        "sandbox_error": 1,
        "broken_task": 1,
    }


def test_summary_threshold_decides_success():
    trials = [trial("a", 0, 0.5), trial("a", 1, 0.2)]
    assert summarize(trials, k=1, threshold=0.5)["successes"] == 1
    assert summarize(trials, k=1, threshold=0.1)["pass_at"]["1"] == 1.0
