"""pass@k: the unbiased estimator, and an evaluation's per-task and overall summary.

With ``n`` scored trials of a task, ``c`` of them successes, the chance that at least one
of ``k`` trials drawn without replacement succeeds is ``1 - C(n-c, k) / C(n, k)`` (Chen et
al., 2021, "Evaluating Large Language Models Trained on Code"). It needs ``k <= n``.

Infrastructure failures (``TerminationReason.is_infrastructure_failure``: sandbox, engine
and verifier errors, broken tasks) say nothing about the policy: they are counted apart and
left out of ``n``, as they are left out of the loss in training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from math import comb
from typing import Any

from slr.contracts import TrialResult


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with ``n`` scored trials and ``c`` successes."""
    if not 0 <= c <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (trials), got k={k} with n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def success(trial: TrialResult, threshold: float) -> bool:
    return trial.reward is not None and trial.reward.value >= threshold


def summarize(
    trials: Iterable[TrialResult], *, k: int, threshold: float = 1.0, task_ids: Iterable[str] = ()
) -> dict[str, Any]:
    """Per-task ``n``, successes and pass@1..k, and the overall pass@j averaged over tasks.

    A task with fewer than ``j`` scored trials (infrastructure failures took the rest) has
    no pass@j; the overall pass@j averages the tasks that have one and says how many
    (``tasks_counted``).
    """
    by_task: dict[str, list[TrialResult]] = {t: [] for t in task_ids}
    for trial in trials:
        by_task.setdefault(trial.task_id, []).append(trial)
    tasks: dict[str, dict[str, Any]] = {}
    for task_id, rs in by_task.items():
        scored = [r for r in rs if not r.termination.is_infrastructure_failure]
        c = sum(success(r, threshold) for r in scored)
        rewards = [r.reward.value for r in scored if r.reward is not None]
        tasks[task_id] = {
            "n": len(scored),
            "successes": c,
            "infra_failures": len(rs) - len(scored),
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "pass_at": {
                str(j): pass_at_k(len(scored), c, j) if j <= len(scored) else None
                for j in range(1, k + 1)
            },
            "terminations": dict(Counter(str(r.termination) for r in rs)),
        }
    overall: dict[str, Any] = {}
    counted: dict[str, int] = {}
    for j in range(1, k + 1):
        values = [t["pass_at"][str(j)] for t in tasks.values() if t["pass_at"][str(j)] is not None]
        overall[str(j)] = sum(values) / len(values) if values else None
        counted[str(j)] = len(values)
    all_trials = [r for rs in by_task.values() for r in rs]
    return {
        "k": k,
        "success_threshold": threshold,
        "trials": len(all_trials),
        "scored": sum(t["n"] for t in tasks.values()),
        "successes": sum(t["successes"] for t in tasks.values()),
        "infra_failures": sum(t["infra_failures"] for t in tasks.values()),
        "pass_at": overall,
        "tasks_counted": counted,
        "terminations": dict(Counter(str(r.termination) for r in all_trials)),
        "tasks": tasks,
    }
