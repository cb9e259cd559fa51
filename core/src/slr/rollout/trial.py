"""The trial runner: sandbox -> agent phase -> verifier phase -> one ``TrialResult``.

``run_trial`` never raises for a failure inside the trial: every failure becomes a result
with the termination reason that says whose fault it was (see ``TerminationReason``), and
the sandbox is stopped on every path, cancellation included (cancellation itself is
re-raised after the cleanup, as asyncio expects).

Anti reward-hacking, in the order a trial meets it (threat model: docs/sandboxes.md):
the image is built from ``environment/`` only, so ``tests/`` and ``solution/`` are not in
it; the git history of the working repository is squashed to one commit for the agent
phase (the original ``.git`` waits on the host); the sandbox reaches only the proxy; after
the agent phase every process it left is killed, the history is restored if the task asks,
and only then do the tests enter the sandbox.

One optional step sits between the phases: with ``capture_diff`` (``slr infer``), once the
agent's processes are gone and before the history is restored, the working repository's
change since the agent phase began (``git diff`` against the snapshot commit, new files
included, binary files as git's binary patches, Python byte-code left out) is kept as
``TrialResult.diff``; without a repository the diff is empty, and when git fails the diff
is None and the trial's ``capture_diff`` log says why (the reward stands).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs
import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from slr import log as slr_log
from slr.contracts import (
    BUNDLE_MOUNT,
    AgentAdapter,
    AgentOutcome,
    BrokenEnvironment,
    ContextOverflow,
    Endpoint,
    EngineUnavailable,
    PoolStarted,
    Reward,
    Sandbox,
    SandboxBackend,
    SandboxError,
    TerminationReason,
    Trajectory,
    TrialResult,
    Verifier,
    VerifierError,
    VerifierTimeout,
)
from slr.rollout.costs import CostMeter, ModelClock, sandbox_cpu_s
from slr.sandboxing.labels import trial_labels
from slr.tasks import AGENT_LOGS_DIR, Task

log = structlog.get_logger()

T = TerminationReason


class SessionFactory(Protocol):
    """Opens and closes proxy sessions; the real one is the in-process proxy."""

    async def open(self, trial_id: str) -> tuple[Endpoint, Any]:
        """A session for one trial: its endpoint as the host sees it, and a handle."""
        ...

    async def close(self, handle: Any) -> Trajectory | None:
        """End the session and return everything the policy generated in it."""
        ...


@runtime_checkable
class ClockedSessions(Protocol):
    """A session factory that keeps each session's ``ModelClock`` (optional; the proxy's)."""

    def clock(self, handle: Any) -> ModelClock: ...


def session_clock(sessions: SessionFactory, handle: Any) -> ModelClock | None:
    """The session's ``ModelClock`` when the factory keeps one (``clock(handle)``, optional:
    the proxy's does; a factory without it leaves model time at 0)."""
    return sessions.clock(handle) if isinstance(sessions, ClockedSessions) else None


def bundle_mounts(bundle: Any) -> dict[Path, str]:
    """The read-only mounts that put an agent's bundle at ``BUNDLE_MOUNT`` (none without one)."""
    return {bundle.path: BUNDLE_MOUNT} if bundle.path.is_dir() else {}


class StandInSessions:
    """A stand-in session factory for agents that call no model (``oracle``, ``nop``).

    It serves nothing: the endpoint points at a closed port and the trajectory is empty.
    Use it to validate tasks and backends; training uses the proxy's session factory.
    """

    def __init__(self, base_url: str = "http://127.0.0.1:9/v1") -> None:
        self.base_url = base_url

    async def open(self, trial_id: str) -> tuple[Endpoint, Any]:
        return Endpoint(base_url=self.base_url, api_key="stand-in", model="none"), trial_id

    async def close(self, handle: Any) -> Trajectory | None:
        return Trajectory(session_id=str(handle))


class _Failed(Exception):
    """Ends the trial early with ``termination`` (internal control flow)."""

    def __init__(self, termination: TerminationReason, message: str) -> None:
        super().__init__(message)
        self.termination = termination


def new_trial_id(task_id: str) -> str:
    return f"{task_id}-{uuid.uuid4().hex[:10]}"


async def run_trial(
    task: Task,
    *,
    backend: SandboxBackend,
    agent: AgentAdapter,
    verifier: Verifier,
    session_factory: SessionFactory,
    trial_id: str | None = None,
    agent_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    agent_timeout_s: float | None = None,
    agent_timeout_multiplier: float = 1.0,
    group_id: str | None = None,
    step: int | None = None,
    run_id: str | None = None,
    capture_diff: bool = False,
) -> TrialResult:
    """Run one trial of ``task`` and return its record.

    ``agent_timeout_s`` overrides the task's ``[agent] timeout_sec``; the timeout in force
    (either) is scaled by ``agent_timeout_multiplier``, as Harbor scales it. ``capture_diff``
    keeps the agent's change to the working repository as the result's ``diff`` (module
    docstring). The sandbox carries the run, trial and task labels
    (``slr.sandboxing.labels.trial_labels``) plus ``labels``, which cannot override them.
    Nothing is written here: recording a trial is
    ``slr.rollout.recorder.TrialRecorder.record``'s job.
    """
    trial_id = trial_id or new_trial_id(task.id)
    trial = _Trial(
        task=task,
        backend=backend,
        agent=agent,
        verifier=verifier,
        sessions=session_factory,
        trial_id=trial_id,
        agent_name=agent_name,
        labels=trial_labels(run_id=run_id, trial_id=trial_id, task_id=task.id, extra=labels),
        agent_timeout_s=agent_timeout_s,
        agent_timeout_multiplier=agent_timeout_multiplier,
        capture_diff=capture_diff,
    )
    with slr_log.bound(trial_id=trial.trial_id, task_id=task.id):
        result = await trial.run()
    return attrs.evolve(result, group_id=group_id, step=step)


async def run_trials(
    jobs: Iterable[Callable[[], Awaitable[TrialResult]]],
    *,
    concurrency: int,
    label: str | None = None,
) -> list[TrialResult]:
    """Run trial thunks with at most ``concurrency`` at once, results in job order.

    With ``label``, a progress bar on stderr counts finished trials (only on a terminal).
    Cancelled (or a job raising), it cancels the other jobs and returns only once all of
    them have ended, each trial's sandbox stopped.
    """
    jobs = list(jobs)
    sem = asyncio.Semaphore(concurrency)
    with Progress(
        TextColumn(label or "trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=label is None or not sys.stderr.isatty(),
    ) as progress:
        bar = progress.add_task("trials", total=len(jobs))

        async def one(job: Callable[[], Awaitable[TrialResult]]) -> TrialResult:
            async with sem:
                result = await job()
            progress.advance(bar)
            return result

        tasks = [asyncio.ensure_future(one(j)) for j in jobs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            # gather returns at the first cancelled or failed job while the others still
            # run: cancel them and wait until every trial has stopped its sandbox, so the
            # caller (which closes the backend next) never outlives a trial's cleanup
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise


class _Trial:
    # Set from ``run_trial``'s arguments, which ``__init__`` takes as keywords.
    task: Task
    backend: SandboxBackend
    agent: AgentAdapter
    verifier: Verifier
    sessions: SessionFactory
    trial_id: str
    agent_name: str | None
    labels: dict[str, str]
    agent_timeout_s: float | None
    agent_timeout_multiplier: float
    capture_diff: bool

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)
        self.timings: dict[str, float] = {}
        self.logs: dict[str, str] = {}
        self.sandbox: Sandbox | None = None
        self.session: Any = None
        self.session_open = False
        self.trajectory: Trajectory | None = None
        self.git_backup: Path | None = None
        self.git_top: str | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="slr-trial-")
        self.agent_version: str | None = None
        self.meter = CostMeter(lambda: sandbox_cpu_s(self.sandbox) if self.sandbox else None)
        self.clock: ModelClock | None = None
        self.diff: str | None = None

    def _result(
        self,
        termination: TerminationReason,
        *,
        reward: Reward | None = None,
        error: str | None = None,
    ) -> TrialResult:
        return TrialResult(
            trial_id=self.trial_id,
            task_id=self.task.id,
            termination=termination,
            reward=reward,
            agent=self.agent_name,
            agent_version=self.agent_version,
            error=error,
            timings=dict(self.timings),
            trajectory=self.trajectory,
            logs=dict(self.logs),
            diff=self.diff,
        )

    @contextlib.asynccontextmanager
    async def _timed(self, name: str):
        start = time.monotonic()
        try:
            yield
        finally:
            self.timings[f"{name}_s"] = round(time.monotonic() - start, 4)

    async def run(self) -> TrialResult:
        start = self.meter.marks["sandbox_start"] = time.monotonic()
        try:
            result = await self._phases()
        except _Failed as exc:
            log.warning("trial failed", termination=str(exc.termination), error=str(exc))
            result = self._result(exc.termination, error=str(exc))
        except asyncio.CancelledError:
            await self._cleanup()
            raise
        except Exception as exc:  # a bug somewhere below: still a record, not a crash
            log.exception("trial crashed")
            result = self._result(T.SANDBOX_ERROR, error=f"{type(exc).__name__}: {exc}")
        await self._cleanup()
        self.meter.mark("end", read_cpu=False)
        self.timings["total_s"] = round(self.meter.marks["end"] - start, 4)
        sandbox = self.sandbox
        pool_start_s = sandbox.pool_start_s if isinstance(sandbox, PoolStarted) else None
        costs = self.meter.costs(self.clock, pool_start_s=pool_start_s)
        return attrs.evolve(
            result, timings=dict(self.timings), trajectory=self.trajectory, costs=costs
        )

    async def _phases(self) -> TrialResult:
        task = self.task
        # -- sandbox ---------------------------------------------------------------------
        async with self._timed("prepare"):
            await self._guard(self.backend.prepare(task), "preparing the environment")
        try:
            bundle = await asyncio.to_thread(self.agent.bundle)
        except Exception as exc:
            raise _Failed(T.AGENT_ERROR, f"building the agent's bundle failed: {exc!r}") from exc
        self.agent_version = bundle.version or None
        mounts = bundle_mounts(bundle)
        async with self._timed("start"):
            self.sandbox = await self._guard(
                self.backend.start(
                    task,
                    trial_id=self.trial_id,
                    labels=self.labels,
                    mounts=mounts,
                ),
                "starting the sandbox",
            )
            if task.squash_git_history:
                await self._guard(self._squash_git(), "squashing the git history")
        sandbox = self.sandbox
        assert sandbox is not None  # started above

        # -- agent phase -----------------------------------------------------------------
        try:
            endpoint, self.session = await self.sessions.open(self.trial_id)
            self.session_open = True
        except Exception as exc:
            raise _Failed(T.ENGINE_ERROR, f"the proxy could not open a session: {exc}") from exc
        self.clock = session_clock(self.sessions, self.session)
        if self.clock is not None:
            self.clock.on_first_call = self.meter.first_call
        self.meter.mark("agent")
        inner = attrs.evolve(endpoint, base_url=sandbox.proxy_url(endpoint.base_url))
        timeout = (self.agent_timeout_s or task.agent_timeout_s()) * self.agent_timeout_multiplier
        termination, error = T.COMPLETED, None
        async with self._timed("agent"):
            try:
                await self._guard(
                    sandbox.exec(
                        f"mkdir -p {AGENT_LOGS_DIR} && chmod 777 {AGENT_LOGS_DIR}", user="root"
                    ),
                    "making the agent log folder",
                )
                kwargs = {"task": task} if self.agent.accepts_task else {}
                outcome: AgentOutcome = await asyncio.wait_for(
                    self.agent.run(sandbox, task.instruction, inner, timeout_s=timeout, **kwargs),
                    # The adapter enforces the timeout itself; this is the backstop.
                    timeout=timeout + 60,
                )
                self.logs.update({f"agent.{k}": v for k, v in outcome.logs.items()})
                if outcome.timed_out:
                    termination, error = T.AGENT_TIMEOUT, f"agent ran past {timeout:g}s"
            except _Failed:
                raise
            except TimeoutError:
                termination, error = T.AGENT_TIMEOUT, f"agent ran past {timeout:g}s (backstop)"
            except SandboxError as exc:
                raise _Failed(
                    T.SANDBOX_ERROR, f"sandbox failed during the agent phase: {exc}"
                ) from exc
            except ContextOverflow as exc:
                termination, error = T.CONTEXT_OVERFLOW, str(exc)
            except EngineUnavailable as exc:
                raise _Failed(T.ENGINE_ERROR, str(exc)) from exc
            except Exception as exc:
                log.warning("agent adapter raised", error=repr(exc))
                termination, error = T.AGENT_ERROR, f"{type(exc).__name__}: {exc}"
        await self._close_session()

        # -- verifier phase --------------------------------------------------------------
        self.meter.mark("verifier")
        async with self._timed("verifier"):
            # Nothing the agent started may outlive its phase (tampering with the tests).
            await self._guard(sandbox.end_processes(), "ending the agent's processes")
            if self.capture_diff:
                await self._guard(self._capture_diff(), "capturing the agent's diff")
            if self.git_backup is not None and task.restore_git_history:
                await self._guard(self._restore_git(), "restoring the git history")
            await self._guard(sandbox.set_network(task.verifier.network), "setting the network")
            try:
                reward = await self.verifier.verify(sandbox, task)
            except VerifierTimeout as exc:
                raise _Failed(T.VERIFIER_TIMEOUT, str(exc)) from exc
            except VerifierError as exc:
                raise _Failed(T.VERIFIER_ERROR, str(exc)) from exc
            except SandboxError as exc:
                raise _Failed(
                    T.SANDBOX_ERROR, f"sandbox failed during verification: {exc}"
                ) from exc
            except Exception as exc:
                raise _Failed(T.VERIFIER_ERROR, f"{type(exc).__name__}: {exc}") from exc
        for key in ("stdout", "stderr"):
            if key in reward.details:
                self.logs[f"verifier.{key}"] = str(reward.details[key])
        return self._result(termination, reward=reward, error=error)

    async def _guard(self, aw: Awaitable[Any], doing: str) -> Any:
        try:
            return await aw
        except BrokenEnvironment as exc:
            if exc.build_log:
                self.logs["build"] = exc.build_log[-20000:]
            raise _Failed(T.BROKEN_TASK, str(exc)) from exc
        except SandboxError as exc:
            raise _Failed(T.SANDBOX_ERROR, f"{doing}: {exc}") from exc

    # -- git history -----------------------------------------------------------------------

    async def _squash_git(self) -> None:
        sandbox = self.sandbox
        assert sandbox is not None
        probe = await sandbox.exec(
            "top=$(git -c safe.directory='*' rev-parse --show-toplevel 2>/dev/null) || exit 0; "
            '[ -d "$top/.git" ] || exit 0; '
            'printf "%s\\n%s\\n" "$top" "$(git -c safe.directory=\'*\' -C "$top" symbolic-ref '
            '--short -q HEAD || echo main)"',
            user="root",
        )
        lines = probe.stdout.split("\n")
        if not probe.ok or len(lines) < 2 or not lines[0].startswith("/"):
            return  # no repository in the working directory: nothing to hide
        top, branch = lines[0], lines[1] or "main"
        backup = Path(self._tmp.name) / "git"
        await sandbox.download(f"{top}/.git", backup)
        squash = await sandbox.exec(
            ["sh", "-c", _SQUASH, "squash", top, branch], user="root", cwd="/"
        )
        if not squash.ok:
            raise SandboxError(f"git squash in {top} failed: {squash.stderr.strip()[-500:]}")
        self.git_backup, self.git_top = backup, top

    async def _capture_diff(self) -> None:
        sandbox = self.sandbox
        assert sandbox is not None
        # A throw-away index, so the repository's own index is what the agent left.
        res = await sandbox.exec(["sh", "-c", _DIFF, "diff", self.git_top or ""], user="root")
        if res.ok:
            self.diff = res.stdout
        else:  # the reward still counts; only the diff is missing, and the log says why
            self.logs["capture_diff"] = f"git diff failed: {res.stderr.strip()[-2000:]}"

    async def _restore_git(self) -> None:
        sandbox, top = self.sandbox, self.git_top
        assert sandbox is not None and top is not None and self.git_backup is not None
        owner = await sandbox.exec(["stat", "-c", "%u:%g", top], user="root", cwd="/")
        await sandbox.exec(["rm", "-rf", f"{top}/.git"], user="root", cwd="/")
        await sandbox.upload(self.git_backup, f"{top}/.git")
        done = await sandbox.exec(
            ["chown", "-R", owner.stdout.strip() or "0:0", f"{top}/.git"], user="root", cwd="/"
        )
        if not done.ok:
            raise SandboxError(f"restoring {top}/.git failed: {done.stderr.strip()}")

    # -- cleanup ---------------------------------------------------------------------------

    async def _close_session(self) -> None:
        if not self.session_open:
            return
        self.session_open = False
        try:
            self.trajectory = await self.sessions.close(self.session)
        except Exception as exc:
            log.warning("closing the proxy session failed", error=repr(exc))

    async def _cleanup(self) -> None:
        self.meter.mark("cleanup")
        start = time.monotonic()

        async def cleanup() -> None:
            await self._close_session()
            if self.sandbox is not None:
                try:
                    await self.sandbox.stop()
                except Exception as exc:
                    log.warning("stopping the sandbox failed", error=repr(exc))
            self._tmp.cleanup()

        # Shielded: a cancelled trial still removes its sandbox.
        await asyncio.shield(asyncio.ensure_future(cleanup()))
        self.timings["cleanup_s"] = round(time.monotonic() - start, 4)


# The working repository's change since HEAD, untracked files included; nothing if none.
_DIFF = r"""
top=${1:-$(git -c safe.directory='*' rev-parse --show-toplevel 2>/dev/null)} || exit 0
[ -n "$top" ] || exit 0
cd "$top" || exit 0
git -c safe.directory='*' rev-parse -q --verify HEAD >/dev/null || exit 0
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
export GIT_INDEX_FILE="$tmp/index"
git="git -c safe.directory=* -c core.fileMode=true"
$git read-tree HEAD &&
  $git add -A -- . ':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/*.py[co]' &&
  $git diff --cached --binary --no-color --no-ext-diff HEAD
"""

# Re-create the repository with the working tree as its only commit, owned as before.
_SQUASH = r"""
set -e
top=$1; branch=$2
cd "$top"
owner=$(stat -c %u:%g .)
rm -rf .git
git="git -c safe.directory=* -c init.defaultBranch=$branch"
$git init -q
$git add -A
$git -c user.name=slr -c user.email=slr@sandbox.invalid -c commit.gpgsign=false commit -q --allow-empty --no-verify -m "Task snapshot"
chown -R "$owner" .git
"""
