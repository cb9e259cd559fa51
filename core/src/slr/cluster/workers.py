"""Rollout workers as Ray actors, and the driver-side pool that hands them trials.

``[run] rollout_workers = N`` moves the trials out of the driver: N ``RolloutWorker``
actors, placed by ``[run] worker_resources`` (a custom resource such as ``{sandbox = 1}``
puts them on the nodes that run sandboxes). Each builds the run's sandbox backend, agent
and verifier from the run config in its own process, and runs a node-local proxy in front
of the engine replicas: a balancer over the replicas' actor handles
(``slr.cluster.engines.attach_replicas``), so model calls go from the worker's node straight
to the engines, never through the driver.

A worker writes nothing. ``run_one(spec, version)`` runs one trial (``slr.rollout.recorder.Rollout``)
and returns its ``TrialResult`` and its proxy transcript; many calls may be in flight on one
worker. A call the driver cancels (an async run's trials in flight when it ends) cancels the
worker's task, and the trial is not recorded, as in the driver. ``RolloutPool`` is the
driver-side ``TrialRunner``: it sends each spec to the least-loaded live worker and records
what comes back through the run's ``TrialRecorder`` (``record``), so the coordinator is the
run directory's only writer.

Warm pools: with ``[rollout] pool_size = N`` every worker keeps up to N sandboxes warm (its
own ``SandboxPool``). The trials the loop announces (``expect``) are placed on workers at
once, the least-loaded first (trials running plus trials placed), and each worker is told
its share, so its pool starts those sandboxes ahead of need; ``run_one`` then sends a placed
trial to the worker holding its sandbox (or, if that worker is gone, to the least-loaded).

A worker that dies mid-trial (its process killed, its node lost): each of its trials is
recorded as ``worker_lost``, an infrastructure failure (excluded from the loss, never
reward 0), and run again under a new id (``<trial id>-r1``, ``-r2``, ...) on a remaining
worker. The retry ids are a function of the spec, so a resumed run finds the retries
already recorded instead of running them twice. When no worker is left, the run stops with
an error that says so.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import attrs
import structlog

from slr.cluster import ray_runtime
from slr.cluster.engines import (
    START_TIMEOUT_S,
    ReplicaHandle,
    actor_options,
    attach_replicas,
    check_placeable,
)
from slr.contracts import TerminationReason, TrialResult
from slr.errors import SlrError, UsageError
from slr.rollout.recorder import TrialRecorder, TrialSpec
from slr.tasks import Task

log = structlog.get_logger()

#: How many times a trial lost with its worker is run again (under a new id each time).
MAX_RETRIES = 2
#: Calls one worker process serves at once (Ray's default for an async actor is 1000).
WORKER_MAX_CONCURRENCY = 256


class NoWorkersLeft(SlrError):
    """Every rollout worker of the run is gone."""


def retry_id(trial_id: str, attempt: int) -> str:
    """The id of the ``attempt``-th re-run of a trial lost with its worker (0: the trial)."""
    return trial_id if attempt == 0 else f"{trial_id}-r{attempt}"


class RolloutWorker:
    """The body of one rollout worker (wrapped by ``ray.remote`` in ``start_rollout_workers``).

    Built from the run config as plain data, with the plugins looked up in this process's
    own plugin manager, exactly as the driver would build them.
    """

    def __init__(
        self,
        config_data: dict[str, Any],
        *,
        name: str,
        run_id: str,
        tasks: Sequence[Task],
        replicas: Sequence[ReplicaHandle],
    ) -> None:
        from slr.config import load_config
        from slr.plugins import get_plugin_manager
        from slr.rollout.recorder import Rollout

        plugins = get_plugin_manager()
        sections = ("backend", "agent", "verifier")
        config = load_config(data=config_data, plugins=plugins, only_plugins=sections)

        self.name = name
        self.rollout = Rollout(
            run_id=run_id,
            plugins=plugins,
            config=config,
            engine=attach_replicas(replicas) if replicas else None,
            backend=plugins.build(config, "backend"),
            agent=plugins.build(config, "agent"),
            verifier=plugins.build(config, "verifier"),
            tasks=tasks,
        )
        self._entered = False

    async def start(self) -> dict[str, Any]:
        """Prepare the tasks and start the proxy; where this worker runs."""
        import ray

        await self.rollout.__aenter__()
        self._entered = True
        return {
            "name": self.name,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    async def run_one(
        self, spec: TrialSpec, weights_version: int | None
    ) -> tuple[TrialResult, dict[str, Any] | None]:
        """One trial, not recorded: its result and its proxy transcript."""
        return await self.rollout.execute(spec, weights_version=weights_version)

    async def expect(self, specs: Sequence[TrialSpec]) -> None:
        """Trials the driver will send here next: the warm pool starts their sandboxes."""
        self.rollout.announce(specs)

    async def close(self) -> None:
        if self._entered:
            self._entered = False
            await self.rollout.__aexit__(None, None, None)


@attrs.define(eq=False)
class _Worker:
    name: str
    actor: Any
    node_id: str
    pid: int
    load: int = 0  # trials running on it
    placed: int = 0  # trials announced for it (``RolloutPool.expect``), not yet sent
    alive: bool = True


class RolloutPool:
    """A ``TrialRunner`` over rollout workers; records through ``session``, the one writer.

    ``weights_version`` (default: the session's) is the version each trial starts under,
    told to the worker with the spec: the coordinator knows best which weights the engines
    serve.
    """

    def __init__(
        self,
        workers: Sequence[_Worker],
        session: TrialRecorder,
        *,
        connection: ray_runtime.Connection | None = None,
    ) -> None:
        self.workers = list(workers)
        self.session = session
        self._connection = connection
        self.lost_trials = 0
        self._placed: dict[str, _Worker] = {}  # trial id -> the worker told to expect it
        self._hints: set[asyncio.Task] = set()

    # -- TrialRunner ------------------------------------------------------------------------

    async def run_one(self, spec: TrialSpec) -> TrialResult:
        """Run one spec on the least-loaded worker and record it (or read back its record).

        A trial lost with its worker is recorded as ``worker_lost`` and run again under
        ``retry_id(spec.trial_id, n)``; the result returned is the last attempt's."""
        run_dir = self.session.run_dir
        result: TrialResult | None = None
        for attempt in range(MAX_RETRIES + 1):
            current = attrs.evolve(spec, trial_id=retry_id(spec.trial_id, attempt))
            if run_dir.has_trial(current.trial_id):
                result = run_dir.trial(current.trial_id)
            else:
                result = await self._attempt(current)
            if result.termination is not TerminationReason.WORKER_LOST:
                return result
        assert result is not None
        return result

    def expect(self, specs: Sequence[TrialSpec]) -> None:
        """Place the trials about to run on workers and tell each worker its share, so its
        warm pool (``[rollout] pool_size``) starts their sandboxes now; see ``TrialRunner``.

        Trials already recorded or already placed are left out. A hint only: a worker that
        cannot be told is logged, and its trials still run (``run_one`` re-places them).
        Without a pool nothing is placed: each trial goes to the least-loaded worker when it
        starts."""
        if not self.session.config.rollout.pool_size:
            return
        run_dir = self.session.run_dir
        live = self.live()
        if not live:
            return
        shares: dict[str, tuple[_Worker, list[TrialSpec]]] = {}
        for spec in specs:
            if spec.trial_id in self._placed or run_dir.has_trial(spec.trial_id):
                continue
            worker = min(live, key=lambda w: w.load + w.placed)
            worker.placed += 1
            self._placed[spec.trial_id] = worker
            shares.setdefault(worker.name, (worker, []))[1].append(spec)
        for worker, share in shares.values():
            hint = asyncio.get_running_loop().create_task(self._tell(worker, share))
            self._hints.add(hint)
            hint.add_done_callback(self._hints.discard)

    async def _tell(self, worker: _Worker, specs: list[TrialSpec]) -> None:
        from ray.exceptions import RayError

        try:
            await worker.actor.expect.remote(specs)
        except RayError as exc:  # a dead worker: its trials are re-placed when they run
            log.info(
                "a rollout worker was not told its next trials",
                worker=worker.name,
                error=_first_line(exc),
            )

    async def run(
        self, specs: Sequence[TrialSpec], *, label: str | None = None
    ) -> list[TrialResult]:
        """``run_one`` over the specs, at most ``rollout.concurrency`` at once, in spec order
        (what the synchronous loop calls)."""
        ids = [s.trial_id for s in specs]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"trial ids must be unique within a run; given twice: {twice}")
        sem = asyncio.Semaphore(self.session.config.rollout.concurrency)

        async def one(spec: TrialSpec) -> TrialResult:
            async with sem:
                return await self.run_one(spec)

        if label:
            log.info("rollout", label=label, trials=len(specs), workers=len(self.live()))
        self.expect(specs)
        return list(await asyncio.gather(*(one(s) for s in specs)))

    # -- workers ----------------------------------------------------------------------------

    def live(self) -> list[_Worker]:
        return [w for w in self.workers if w.alive]

    def _pick(self, spec: TrialSpec) -> _Worker:
        """The worker told to expect ``spec`` (its sandbox is warm there), unless that worker
        is gone or runs more than one trial more than the least-loaded one (its trials took
        longer: balance wins over a warm sandbox); else the least-loaded."""
        live = self.live()
        placed = self._placed.pop(spec.trial_id, None)
        if placed is not None:
            placed.placed -= 1
            if placed.alive and placed.load <= min(w.load for w in live) + 1:
                return placed
        if not live:
            raise NoWorkersLeft(
                f"all {len(self.workers)} rollout worker(s) are gone; see the Ray logs of "
                f"their nodes, then resume the run (`slr run --resume RUN_DIR`)"
            )
        return min(live, key=lambda w: w.load)

    async def _attempt(self, spec: TrialSpec) -> TrialResult:
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        worker = self._pick(spec)
        version = self.session.weights_version()
        worker.load += 1
        call = worker.actor.run_one.remote(spec, version)
        try:
            result, transcript = await call
        except (RayActorError, ActorDiedError, ActorUnavailableError) as exc:
            return await self._lost(worker, spec, version, exc)
        except asyncio.CancelledError:
            # the loop no longer wants it (the run is done): the worker's task is cancelled
            # too, so the trial's own cleanup stops its sandbox; nothing is recorded
            ray.cancel(call)
            raise
        finally:
            worker.load -= 1
        return await self.session.record(result, transcript=transcript)

    async def _lost(
        self, worker: _Worker, spec: TrialSpec, version: int | None, exc: BaseException
    ) -> TrialResult:
        if worker.alive:
            worker.alive = False
            log.warning("rollout worker lost", worker=worker.name, error=_first_line(exc))
            self.session.run_dir.append_event("worker_lost", worker=worker.name)
        self.lost_trials += 1
        return await self.session.record(
            TrialResult(
                trial_id=spec.trial_id,
                task_id=spec.task.id,
                termination=TerminationReason.WORKER_LOST,
                group_id=spec.group_id,
                step=spec.step,
                agent=self.session.config.agent.name,
                weights_version=version,
                error=f"rollout worker {worker.name} died: {_first_line(exc)}",
            )
        )

    def metrics(self) -> dict[str, Any]:
        return {
            "workers/live": len(self.live()),
            "workers/lost": len(self.workers) - len(self.live()),
            "trials/worker_lost": self.lost_trials,
        }

    async def close(self) -> None:
        """Stop every worker's parts, then end the actors."""
        import ray
        from ray.exceptions import RayError

        live = self.live()
        for w in self.workers:
            w.alive = False
        for hint in list(self._hints):
            hint.cancel()
        results = await asyncio.gather(
            *(asyncio.wait_for(w.actor.close.remote(), 60) for w in live),
            return_exceptions=True,
        )
        for w, r in zip(live, results, strict=True):
            if isinstance(r, BaseException) and not isinstance(r, RayError | TimeoutError):
                log.warning("closing a rollout worker failed", worker=w.name, error=repr(r))
        for w in self.workers:
            ray.kill(w.actor)
        if self._connection is not None:
            self._connection.release()
            self._connection = None


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


async def start_rollout_workers(
    config: Any,
    session: TrialRecorder,
    *,
    replicas: Sequence[ReplicaHandle],
    tasks: Sequence[Task],
) -> RolloutPool:
    """``config.run.rollout_workers`` workers, started and ready, behind a ``RolloutPool``
    that records into ``session``. ``replicas``: the engine replicas the workers' proxies
    reach (none: only agents that call no model can run)."""
    run = config.run
    count = int(run.rollout_workers)
    if count < 1:
        raise ValueError(f"rollout_workers = {count}: workers start only for 1 or more")
    agent = session.agent  # None: no agent was given, so assume one that calls the model
    if not replicas and (agent is None or agent.needs_model):
        raise UsageError(
            f"run.rollout_workers = {count} needs the engine out of the driver: the "
            f"workers' proxies reach engine replicas, not the driver's embedded engine; "
            f"set run.engine_replicas >= 1"
        )
    import ray
    from ray.exceptions import RayError

    connection = ray_runtime.connect(run.ray_address)
    try:
        resources = dict(run.worker_resources)
        check_placeable(resources, count, what="run.worker_resources", count_key="rollout_workers")
        remote = ray.remote(RolloutWorker)
        data = config.to_dict()
        names = [f"worker-{i}" for i in range(count)]
        actors: list[Any] = [
            remote.options(  # pyright: ignore[reportAttributeAccessIssue]
                max_restarts=0,  # a lost worker's trials are re-queued, not resumed
                max_concurrency=WORKER_MAX_CONCURRENCY,
                **actor_options(resources),
            ).remote(data, name=name, run_id=session.run_id, tasks=list(tasks), replicas=replicas)
            for name in names
        ]
        try:
            infos = await asyncio.wait_for(
                asyncio.gather(*(a.start.remote() for a in actors)), START_TIMEOUT_S
            )
        except (RayError, TimeoutError) as exc:
            for a in actors:
                ray.kill(a)
            raise UsageError(
                f"{count} rollout worker(s) asking {resources} each did not start: "
                f"{_first_line(exc)}. The cluster has {ray.available_resources()} free; "
                f"lower run.rollout_workers or change run.worker_resources"
            ) from exc
    except BaseException:
        connection.release()
        raise
    workers = [
        _Worker(name=name, actor=actor, node_id=info["node_id"], pid=info["pid"])
        for name, actor, info in zip(names, actors, infos, strict=True)
    ]
    log.info(
        "rollout workers ready",
        workers=count,
        nodes=sorted({w.node_id[:12] for w in workers}),
        resources=resources,
    )
    return RolloutPool(workers, session, connection=connection)
