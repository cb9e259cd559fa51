"""The label keys a sandbox carries: one spelling for every backend, test and doc.

A sandbox is labelled with the run, trial and task it serves, so that cleanup (at start, on
``--resume``, in tests) finds every container or pod of a run by one selector. Before these
constants the same facts were spelled ``slr.run``, ``slr.run_id``, ``slr.task`` and
``slr.task_id`` in different files, and a selector written one way never matched labels
written the other way.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The run directory's id (``runs/<run-id>``).
RUN = "slr.run_id"
#: The trial id (also the trial record's file name).
TRIAL = "slr.trial_id"
#: The task id.
TASK = "slr.task_id"
#: Marks a resource as an slr sandbox, whatever else it carries.
SANDBOX = "slr.sandbox"
#: The host, process id and process start time of the slr process that owns the sandbox:
#: orphan cleanup removes sandboxes whose owner is gone.
OWNER_HOST = "slr.owner_host"
OWNER_PID = "slr.owner_pid"
OWNER_START = "slr.owner_start"
#: On a sandbox started ahead of its trial by ``slr.sandboxing.pool``: the pool's id (its
#: trial label is then a placeholder, ``pool-<pool id>-<hex>``).
POOL = "slr.pool"

__all__ = [
    "OWNER_HOST",
    "OWNER_PID",
    "OWNER_START",
    "POOL",
    "RUN",
    "SANDBOX",
    "TASK",
    "TRIAL",
    "trial_labels",
]


def trial_labels(
    *, run_id: str | None, trial_id: str, task_id: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The labels of one trial's sandbox; ``extra`` (a user's own labels) cannot override."""
    labels = dict(extra or {})
    if run_id is not None:
        labels[RUN] = run_id
    labels[TRIAL] = trial_id
    labels[TASK] = task_id
    return labels
