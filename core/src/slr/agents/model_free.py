"""The agents that call no model: ``oracle`` (the task's own solution) and ``nop``.

They ship with the core, registered by the plugin manager itself
(``slr.agents.plugin``), because every installation needs them: they
validate tasks and sandbox backends (a sound task scores 1 with the oracle and 0 with nop,
``slr check-tasks``), and the core's own tests and conformance suites run trials with them.
"""

from __future__ import annotations

from pathlib import Path

from slr import __version__
from slr.contracts import AgentAdapter, AgentOutcome, Bundle, Endpoint, Sandbox
from slr.tasks import SOLUTION_DIR, Task

#: An empty folder: these agents need no runtime in the sandbox, yet every agent has a bundle.
EMPTY_BUNDLE = Path(__file__).with_name("empty_bundle")


class _NoModelAgent(AgentAdapter):
    protocol = "openai"  # never used: these agents make no model calls
    needs_model = False
    """No proxy needed: ``slr eval`` / ``check-tasks`` run them with stand-in sessions."""

    def bundle(self) -> Bundle:
        """Nothing to install in the sandbox: an empty bundle."""
        return Bundle(path=EMPTY_BUNDLE, version=__version__)


class OracleAgent(_NoModelAgent):
    """Runs the task's own ``solution/solve.sh``: the reference a task must score 1 with."""

    accepts_task = True
    """The trial runner passes ``task=``: the solution lives there."""

    async def run(
        self,
        sandbox: Sandbox,
        instruction: str,
        endpoint: Endpoint,
        *,
        timeout_s: float,
        task: Task | None = None,
    ) -> AgentOutcome:
        if task is None:
            raise RuntimeError("the oracle agent runs a task's solution: call run with task=")
        if task.solution_dir is None:
            raise RuntimeError(f"{task.path} has no solution/solve.sh for the oracle to run")
        await sandbox.upload(task.solution_dir, SOLUTION_DIR)
        await sandbox.exec(["chmod", "-R", "a+rX", SOLUTION_DIR], user="root", cwd="/")
        res = await sandbox.exec(
            ["bash", f"{SOLUTION_DIR}/solve.sh"],
            timeout_s=timeout_s,
            user=task.agent.user,
            env=task.solution_env,
        )
        await sandbox.exec(["rm", "-rf", SOLUTION_DIR], user="root", cwd="/")
        return AgentOutcome(
            exit_code=res.exit_code,
            timed_out=res.timed_out,
            logs={"solve.stdout": res.stdout, "solve.stderr": res.stderr},
        )


class NopAgent(_NoModelAgent):
    """Does nothing: a sound task scores 0 with it."""

    async def run(
        self, sandbox: Sandbox, instruction: str, endpoint: Endpoint, *, timeout_s: float
    ) -> AgentOutcome:
        return AgentOutcome(exit_code=0)
