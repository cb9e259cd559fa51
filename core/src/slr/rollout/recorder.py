"""The trial recorder: start the parts, run trials, record each exactly once, close the parts.

Every command that produces trials goes through one ``TrialRecorder``: ``slr run`` (one
recorder for the whole run, one ``run`` call per step), ``slr eval`` (one call for every
sample), ``slr serve`` (sessions opened by hand, recorded without a reward). It is an async
context manager:

- entering it removes the sandboxes a dead process left (``cleanup_orphans``), prepares
  every task's environment once, and starts the proxy in front of the engine (without an
  engine, agents that call no model get stand-in sessions);
- ``run_one(spec)`` runs one ``TrialSpec`` (task, trial id, group, step), records it and
  returns its ``TrialResult``; it bounds nothing, the caller decides how many run at once.
  A spec whose trial id is already recorded in the run directory is not run again: its
  record is read back, so a resumed run or eval re-runs only what has no record. This is
  the whole per-trial interface a loop needs (``TrialRunner``): the asynchronous loop
  (``slr.run.async_loop``) talks to the recorder through it alone, and a remote rollout pool
  (workers on other machines sending their records back to the one writer of the run
  directory) is a drop-in replacement that implements it. ``expect(specs)`` announces
  the trials a caller of ``run_one`` is about to start, so a warm sandbox pool
  (``rollout.pool_size``) starts their sandboxes ahead of need;
- ``run(specs)`` is ``run_one`` over a list with at most ``concurrency`` at once, results
  in spec order (what the synchronous loop and ``slr eval`` use);
- every finished trial goes through ``record``, the only recording path: it is written to
  the run directory, logged and announced through ``on_trial_finished`` (a failing hook is
  logged, never stops the run). A cancelled trial is not recorded, so resume runs it;
- leaving it stops the proxy and closes the backend and the engine, on every path.

``Rollout`` is the part of the recorder that writes nothing: the parts, the proxy, and
``execute(spec)``, which runs one trial and returns its result and its proxy transcript.
``TrialRecorder`` adds the run directory and ``record``. A remote rollout worker
(``slr.cluster.workers``) holds a ``Rollout`` in its own process and returns what
``execute`` gives; the coordinator records it, so the run directory has one writer.

The recorder knows trials, not training: the loop owns steps, the optimizer and weight
sync, and only hands the recorder the specs of a step. Anything that can build a list of
specs (a later ``slr infer``, a remote rollout worker) can use it as is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

import attrs
import structlog

from slr.config import Config
from slr.contracts import Prestarting, SamplingParams, TerminationReason, TrialResult
from slr.plugins import PluginManager
from slr.proxy import Proxy, ProxySessions
from slr.proxy.server import Session, write_transcript
from slr.rollout.trial import (
    SessionFactory,
    StandInSessions,
    bundle_mounts,
    run_trial,
    run_trials,
)
from slr.run.directory import RunDir
from slr.sandboxing.pool import SandboxPool
from slr.tasks import Task

log = structlog.get_logger()


@attrs.frozen(kw_only=True)
class TrialSpec:
    """One trial to run: which task, under which id, in which group of which step.

    ``capture_diff`` keeps the agent's change to the working repository in the record
    (``TrialResult.diff``; ``slr infer`` sets it).
    """

    task: Task
    trial_id: str
    group_id: str | None = None
    step: int | None = None
    capture_diff: bool = False


class TrialRunner(Protocol):
    """What a loop needs to run trials: one spec in, its recorded result out.

    ``run_one`` runs the spec (or reads back its record if the trial id is already
    recorded), records it exactly once in the run directory and returns it. It may be
    called many times at once; bounding concurrency is the caller's job. Cancelling the
    call ends the trial without recording it. ``TrialRecorder`` is the in-process
    implementation; a pool of remote rollout workers implements the same method.
    """

    async def run_one(self, spec: TrialSpec) -> TrialResult: ...

    def expect(self, specs: Sequence[TrialSpec]) -> None:
        """A hint: these trials are about to be run, in this order, so a warm sandbox pool
        can start their sandboxes ahead of need. Announcing a trial that then never runs
        is harmless, and ``run_one`` works the same without it."""
        ...


class BatchRunner(TrialRunner, Protocol):
    """A ``TrialRunner`` that also runs a list of specs (what the synchronous loop calls):
    the ones without a record, at most ``rollout.concurrency`` at once, results in spec
    order. ``TrialRecorder`` and the rollout workers' pool implement it."""

    async def run(
        self, specs: Sequence[TrialSpec], *, label: str | None = None
    ) -> list[TrialResult]: ...


def sampling_of(config: Config) -> SamplingParams:
    """The sampling every command uses: ``[rollout]``'s, seeded by ``[run] seed`` (each
    call's own seed derives from it, the trial id and the call number:
    ``slr.proxy.session.call_seed``)."""
    r = config.rollout
    return SamplingParams(
        temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens, seed=config.run.seed
    )


class Rollout:
    """The rollout parts of one process, for as long as it is entered; writes nothing.

    ``engine`` may be None (agents that call no model); ``backend``, ``agent`` and
    ``verifier`` may be None when no trial is run (``slr serve``). ``weights_version`` says
    which weights a trial starts under, recorded as its ``weights_version`` (default: the
    engine's current version when the trial starts; with partial weight updates later
    tokens may carry newer versions, which its segments record per token). Every part it is
    given is closed when it is left. ``serve_proxy = False``: no proxy starts (the trials run
    on rollout workers, each with its own proxy in front of the engine replicas).
    """

    def __init__(
        self,
        *,
        run_id: str,
        plugins: PluginManager,
        config: Config,
        engine: Any = None,
        backend: Any = None,
        agent: Any = None,
        verifier: Any = None,
        tasks: Sequence[Task] = (),
        weights_version: Callable[[], int | None] | None = None,
        serve_proxy: bool = True,
    ) -> None:
        self.run_id, self.plugins, self.config = run_id, plugins, config
        # False: the trials run elsewhere (rollout workers, each with its own proxy)
        self.serve_proxy = serve_proxy
        self.engine, self.backend, self.agent, self.verifier = engine, backend, agent, verifier
        self.tasks = list(tasks)
        self._weights_version = weights_version
        self.proxy: Proxy | None = None
        self.sessions: SessionFactory | None = None
        self._transcripts: ProxySessions | None = None
        self._stack: contextlib.AsyncExitStack | None = None

    # -- entering and leaving ------------------------------------------------------------

    async def __aenter__(self) -> Self:
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            # registered first so it runs last: the proxy stops before the parts close
            stack.push_async_callback(self._close_parts)
            if self.backend is not None:
                await self.backend.cleanup_orphans()
                for task in {t.id: t for t in self.tasks}.values():
                    await self.backend.prepare(task)
                if self.config.rollout.pool_size and self.agent is not None:
                    self.backend = await self._pooled(self.backend)
            if self.engine is None or not self.serve_proxy:
                self.sessions = StandInSessions()
            else:
                proxy = Proxy(self.engine, self.config.proxy, sampling=sampling_of(self.config))
                self.proxy = await stack.enter_async_context(proxy)
                # no agent (slr serve): clients speak the OpenAI API
                protocol = "openai" if self.agent is None else self.agent.protocol
                # transcripts are kept, not written: whoever records the trial writes them
                self._transcripts = ProxySessions(
                    self.proxy, protocol=protocol, keep_transcripts=True
                )
                self.sessions = self._transcripts
        except BaseException as exc:
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, tb)

    async def _close_parts(self) -> None:
        # each part is closed even if closing another failed; a close error is logged,
        # not raised over whatever ended the session
        for name, part in (("backend", self.backend), ("engine", self.engine)):
            if part is None:
                continue
            try:
                await part.close()
            except Exception:
                log.exception("closing a part failed", part=name)

    async def _pooled(self, backend: Any) -> Any:
        """The backend behind a warm pool (``[rollout] pool_size``) for this agent's mounts."""
        try:
            bundle = await asyncio.to_thread(self.agent.bundle)
        except Exception as exc:  # the trials report it, each as agent_error
            log.warning("no sandbox pool: the agent's bundle failed", error=repr(exc))
            return backend
        return SandboxPool(
            backend,
            size=self.config.rollout.pool_size,
            mounts=bundle_mounts(bundle),
            run_id=self.run_id,
            # the agent's own start-up, ahead of the trial (optional; slr.agents.prestart)
            prestart=self.agent.prestart if isinstance(self.agent, Prestarting) else None,
        )

    # -- trials ----------------------------------------------------------------------------

    def weights_version(self) -> int | None:
        if self._weights_version is not None:
            return self._weights_version()
        return None if self.engine is None else self.engine.weights_version

    def announce(self, specs: Sequence[TrialSpec]) -> None:
        """Trials this process is about to run, in order: with a warm pool
        (``rollout.pool_size``) their sandboxes start now; without one this does nothing.
        (A rollout worker is told this by the driver's pool, which knows what comes next.)"""
        self._require_entered()
        if isinstance(self.backend, SandboxPool) and specs:
            self.backend.expect([s.task for s in specs])

    def _require_entered(self) -> None:
        if self._stack is None or self.sessions is None:
            raise RuntimeError(f"{type(self).__name__} runs trials only inside `async with` it")

    async def execute(
        self, spec: TrialSpec, *, weights_version: int | None = None
    ) -> tuple[TrialResult, dict[str, Any] | None]:
        """Run one trial; its result and its proxy transcript (None without a proxy).

        ``weights_version``: the version the trial starts under, when the caller knows it
        better than this process's engine does (a remote worker is told the coordinator's).
        """
        self._require_entered()
        sessions = self.sessions
        assert sessions is not None
        # the version the trial starts under: the oldest any of its tokens can carry
        version = self.weights_version() if weights_version is None else weights_version
        try:
            result = await run_trial(
                spec.task,
                backend=self.backend,
                agent=self.agent,
                verifier=self.verifier,
                session_factory=sessions,
                trial_id=spec.trial_id,
                agent_name=self.config.agent.name,
                run_id=self.run_id,
                agent_timeout_multiplier=self.config.rollout.agent_timeout_multiplier,
                group_id=spec.group_id,
                step=spec.step,
                capture_diff=spec.capture_diff,
            )
        finally:
            kept = self._transcripts.pop_transcript(spec.trial_id) if self._transcripts else None
        return attrs.evolve(result, weights_version=version), kept


class TrialRecorder(Rollout):
    """A ``Rollout`` that records into the run directory; see the module docstring."""

    def __init__(self, run: RunDir, **kwargs: Any) -> None:
        super().__init__(run_id=run.id, **kwargs)
        self.run_dir = run

    async def run(
        self, specs: Sequence[TrialSpec], *, label: str | None = None
    ) -> list[TrialResult]:
        """Run the specs that have no record yet; every spec's result, in spec order."""
        self._require_entered()
        ids = [s.trial_id for s in specs]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"trial ids must be unique within a run; given twice: {twice}")
        recorded = self.run_dir.trial_ids()
        todo = [s for s in specs if s.trial_id not in recorded]
        self.announce(todo)
        jobs = [self._job(s) for s in todo]
        finished = await run_trials(jobs, concurrency=self.config.rollout.concurrency, label=label)
        done = {r.trial_id: r for r in finished}
        return [done[i] if i in done else self.run_dir.trial(i) for i in ids]

    def expect(self, specs: Sequence[TrialSpec]) -> None:
        """The trials about to be run through ``run_one``, in order; see ``TrialRunner``.

        With a warm pool (``rollout.pool_size``) their sandboxes start now; trials already
        recorded are left out (``run_one`` reads them back instead of running them).
        Without a pool this does nothing. ``run`` announces its own specs.
        """
        self._require_entered()
        self.announce([s for s in specs if not self.run_dir.has_trial(s.trial_id)])

    async def run_one(self, spec: TrialSpec) -> TrialResult:
        """Run one spec and record it (or read back its record); see ``TrialRunner``."""
        self._require_entered()
        if self.run_dir.has_trial(spec.trial_id):
            return await asyncio.to_thread(self.run_dir.trial, spec.trial_id)
        return await self._job(spec)()

    def _job(self, spec: TrialSpec):
        async def job() -> TrialResult:
            result, transcript = await self.execute(spec)
            return await self.record(result, transcript=transcript)

        return job

    async def record(
        self, result: TrialResult, *, transcript: Mapping[str, Any] | None = None
    ) -> TrialResult:
        """A finished trial: written once to the run directory (its proxy transcript
        first, the trial's record last), logged, announced.

        The writes (encode a trajectory of tens of thousands of tokens, fsync) run in a
        thread: the proxy serving the other trials shares this event loop.
        """
        if transcript is not None:
            await asyncio.to_thread(write_transcript, self.run_dir.path / "trials", transcript)
        await asyncio.to_thread(self.run_dir.write_trial, result)
        log.info(
            "trial done",
            trial_id=result.trial_id,
            termination=result.termination.value,
            reward=None if result.reward is None else result.reward.value,
        )
        self.plugins.emit("on_trial_finished", run_dir=self.run_dir, trial=result)
        return result

    # -- sessions opened by hand (slr serve) -----------------------------------------------

    def open_session(self, trial_id: str) -> Session:
        """A proxy session for a client outside any sandbox (``slr serve``)."""
        if self.proxy is None:
            raise RuntimeError("open_session needs an engine and the recorder entered")
        return self.proxy.open_session(trial_id)

    async def close_session(self, session: Session, *, task_id: str = "serve") -> TrialResult:
        """End a session from ``open_session`` and record its trajectory, without reward."""
        assert self._transcripts is not None
        trajectory = await self._transcripts.close(session)
        transcript = self._transcripts.pop_transcript(session.trial_id)
        return await self.record(
            transcript=transcript,
            result=TrialResult(
                trial_id=session.trial_id,
                task_id=task_id,
                termination=session.termination or TerminationReason.COMPLETED,
                trajectory=trajectory,
                weights_version=self.weights_version(),
            ),
        )
