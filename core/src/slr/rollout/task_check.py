"""Tasks run end to end with the model-free agents: ``oracle`` must score 1, ``nop`` 0.

What ``slr check-tasks`` and ``slr data validate`` run: no engine and no proxy (stand-in
sessions), the agents the core ships (``slr.agents.model_free``), the backend and verifier
the caller built (``slr.plugins.make_plugin``). The backend is closed when the trials end.
"""

from __future__ import annotations

from collections.abc import Sequence

from slr.agents.model_free import NopAgent, OracleAgent
from slr.contracts import AgentAdapter, SandboxBackend, TrialResult, Verifier
from slr.rollout.trial import StandInSessions, run_trial, run_trials
from slr.tasks import Task


async def run_task_check(
    tasks: Sequence[Task],
    *,
    repeats: int,
    backend: SandboxBackend,
    verifier: Verifier,
    concurrency: int,
) -> list[TrialResult]:
    """``repeats`` trials of every task with ``oracle`` and with ``nop`` (each result's
    ``agent`` names which), at most ``concurrency`` at once, results in task order."""
    agents: dict[str, AgentAdapter] = {"oracle": OracleAgent(), "nop": NopAgent()}
    await backend.cleanup_orphans()
    sessions = StandInSessions()
    jobs = [
        (
            lambda t=t, a=a, name=name: run_trial(
                t,
                backend=backend,
                agent=a,
                verifier=verifier,
                session_factory=sessions,
                agent_name=name,
            )
        )
        for t in tasks
        for name, a in agents.items()
        for _ in range(repeats)
    ]
    try:
        return await run_trials(jobs, concurrency=concurrency)
    finally:
        await backend.close()
