"""The sandbox contract: a fresh, isolated place for one trial."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from slr.contracts.network import NetworkMode
from slr.contracts.records import ExecResult

if TYPE_CHECKING:
    from slr.tasks import Task


@runtime_checkable
class Sandbox(Protocol):
    """One trial's sandbox. Every method may raise ``SandboxError`` when the sandbox died."""

    id: str

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run a command; a timeout kills its process tree.

        A string runs as ``bash -c COMMAND`` (not a login shell, so the image's ``PATH``
        stands; ``slr.sandboxing.command_argv``), a sequence as an argv.
        """
        ...

    async def upload(self, src: Path, dest: str) -> None:
        """Copy a host file or folder to ``dest`` inside the sandbox."""
        ...

    async def download(self, src: str, dest: Path) -> None:
        """Copy ``src`` from the sandbox to the host."""
        ...

    def proxy_url(self, host_url: str) -> str:
        """The URL under which this sandbox reaches a proxy the host serves at ``host_url``."""
        ...

    async def set_network(self, mode: NetworkMode) -> None:
        """``"proxy-only"`` during the agent phase; ``"none"`` or ``"full"`` per the task.

        A sandbox starts in ``"proxy-only"`` and never goes back to it (``SandboxError``).
        ``mode`` is already valid (``network_mode`` checks untyped values at the boundary).
        """
        ...

    async def end_processes(self) -> None:
        """Kill every process still running in the sandbox (the sandbox itself stays).

        The trial runner calls it between the agent and the verifier phase, so nothing the
        agent started can tamper with the tests or the reward file.
        """
        ...

    async def stop(self) -> None:
        """Destroy the sandbox. Idempotent; always called."""
        ...


@runtime_checkable
class MeteredSandbox(Protocol):
    """A sandbox that can say how much CPU it has used (optional for backends)."""

    def cpu_s(self) -> float | None:
        """CPU seconds used by everything that ran in this sandbox since it was made, plus
        host work the backend did to make it where it can tell; None when it cannot tell.
        Cumulative and cheap (a file read): the trial runner reads it at phase boundaries."""
        ...


@runtime_checkable
class HealthChecked(Protocol):
    """A sandbox with its own health check (optional), cheaper than running ``true`` in
    it: the warm pool asks it before handing the sandbox to a trial."""

    async def healthy(self) -> bool: ...


@runtime_checkable
class PoolStarted(Protocol):
    """A sandbox a warm pool started ahead of its trial (``slr.sandboxing.pool``), not a
    backend's: the trial runner charges ``pool_start_s`` (the wall time the pool spent
    starting it) to the trial's costs, and the agent's ``run`` takes ``prestarted`` (what
    its ``Prestarting.prestart`` left in the sandbox, once: ``slr.agents.prestart.take``)."""

    pool_start_s: float
    prestarted: object


@runtime_checkable
class SandboxBackend(Protocol):
    """Makes sandboxes from task environments."""

    async def prepare(self, task: Task) -> None:
        """Build or fetch what ``start`` needs for this task (image build, cached by content)."""
        ...

    async def start(
        self,
        task: Task,
        *,
        trial_id: str,
        labels: Mapping[str, str],
        mounts: Mapping[Path, str] | None = None,
    ) -> Sandbox:
        """A fresh sandbox for one trial of ``task``.

        It starts in the agent phase's network mode, ``"proxy-only"``. ``mounts`` maps host
        folders (an agent's bundle) to read-only paths inside the sandbox.
        """
        ...

    async def cleanup_orphans(self) -> int:
        """Remove sandboxes left by crashed runs (found by label); returns how many."""
        ...

    async def close(self) -> None: ...


class SandboxError(RuntimeError):
    """The sandbox died or could not be made; the trial ends with ``sandbox_error``."""


class BrokenEnvironment(SandboxError):
    """The task's environment cannot be built (bad Dockerfile): the trial is ``broken_task``.

    ``build_log`` holds the build output, for the person who fixes the task.
    """

    def __init__(self, message: str, *, build_log: str = "") -> None:
        super().__init__(message)
        self.build_log = build_log
