"""The load balancer: one ``Engine`` in front of N engine replicas, sticky per session.

A new session goes to the least-loaded healthy replica; every later call of that session
goes to the same replica, so the replica's prefix cache holds the session's history. A
replica that raises (other than for a bad request) or reports itself unhealthy is marked
down; the call is retried on another replica and the session moves there, with the move
recorded. When no replica is left the call raises ``EngineUnavailable``; nothing waits
forever on a dead replica (an optional per-call timeout covers replicas that hang).

A stream fails over the same way until its first chunk arrives; after that the tokens
already delivered cannot be taken back, so a replica failing mid-stream ends the stream
with ``EngineUnavailable`` (the replica is marked down, the session moves on its next call).

A replica marked down is not gone for the rest of the run: while any replica is down the
balancer probes the down ones every ``probe_interval_s`` (``health()``), and one that
answers healthy takes new sessions again (sessions that moved away stay where they are).
The proxy calls ``forget(session_id)`` when a session closes, so pins do not pile up.

Weights: ``update_weights`` reaches only the replicas that are up, so a replica that was
down during an update (or that restarted from its model folder) would come back serving
older weights. The balancer keeps the latest update it published (what ``publish`` made of
it: a reference for out-of-process replicas, else the exported mapping itself) and re-sends
it, as the same version, to a replica before readmitting it; the replica takes no request
until it has answered. An update that cannot be re-sent (``slr.contracts.weights.replayable``:
an export that reads the trainer's live parameters) leaves the replica out of service,
logged by name, until the next update reaches it. ``weights_versions`` and ``metrics()``
show each replica's served version beside the published one.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import structlog
from attrs import define, field, frozen

from slr.contracts import (
    ClosableStream,
    ContextOverflow,
    Engine,
    EngineUnavailable,
    Generation,
    GenerationChunk,
    SamplingParams,
    UpdateMode,
)
from slr.contracts.weights import replayable

log = structlog.get_logger()

#: Errors that are the caller's fault: the same request would fail on any replica.
CLIENT_ERRORS: tuple[type[BaseException], ...] = (ContextOverflow, ValueError, TypeError)
#: Seconds a replica's health check may take before it counts as unhealthy.
HEALTH_TIMEOUT_S = 30.0


@frozen(kw_only=True)
class SessionMove:
    """A session left a replica (because it went down) for another one."""

    session_id: str
    from_replica: str
    to_replica: str
    reason: str
    at: float


@define(kw_only=True, eq=False)
class _Replica:
    name: str
    engine: Engine
    up: bool = True
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    last_error: str | None = None
    sessions: set[str] = field(factory=set)
    # healthy, but the latest update cannot be re-sent to it: the next update readmits it
    awaiting_update: bool = False
    restoring: bool = False  # being brought to the latest weights before readmission


@frozen(kw_only=True, eq=False)
class _Published:
    """The latest weight update: what every replica was sent, as which version."""

    weights: Mapping[str, object]
    version: int
    replayable: bool


class LoadBalancer:
    """Implements ``slr.contracts.Engine`` over replicas of any engine.

    ``call_timeout_s`` bounds one ``generate`` call on one replica, and the wait for each
    chunk of a ``stream`` (``None``: no bound; a replica that dies fails its calls, so a
    bound is only needed for ones that hang). ``probe_interval_s``: how often replicas
    marked down are asked whether they recovered (``None``: only by ``check_health()``).
    ``publish`` turns a state dict into what every replica receives in ``update_weights``,
    once per update (out-of-process replicas: one reference in a shared object store,
    instead of one copy per replica). The latest one is kept until the next update, to
    bring a returning replica up to date (module docstring): without ``publish``, that is
    the exported mapping itself, one more copy of the weights held between updates.
    """

    def __init__(
        self,
        replicas: Sequence[Engine],
        *,
        names: Sequence[str] | None = None,
        call_timeout_s: float | None = None,
        max_sessions: int = 100_000,
        max_moves_logged: int = 1000,
        probe_interval_s: float | None = 10.0,
        publish: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> None:
        if not replicas:
            raise ValueError("LoadBalancer needs at least one engine replica")
        names = list(names) if names is not None else [f"replica-{i}" for i in range(len(replicas))]
        if len(names) != len(replicas) or len(set(names)) != len(names):
            raise ValueError(f"replica names must be unique, one per replica; got {names}")
        self._replicas = [_Replica(name=n, engine=e) for n, e in zip(names, replicas, strict=True)]
        self._sessions: OrderedDict[str, _Replica] = OrderedDict()
        self._max_sessions = max_sessions
        self._call_timeout_s = call_timeout_s
        self.moves: list[SessionMove] = []
        self._max_moves_logged = max_moves_logged
        self._counts = {
            "sticky_hits": 0,
            "new_sessions": 0,
            "moves": 0,
            "failovers": 0,
            "readmissions": 0,
            "weights_restored": 0,
        }
        if probe_interval_s is not None and probe_interval_s <= 0:
            raise ValueError(f"probe_interval_s = {probe_interval_s} must be > 0 (or None: off)")
        self._probe_interval_s = probe_interval_s
        self._probe: asyncio.Task[None] | None = None
        self._publish = publish
        self._latest: _Published | None = None
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        self._closed = False

    @property
    def replicas(self) -> list[tuple[str, Engine]]:
        """Each replica's name and engine, in order (e.g. to reach the same replicas from
        another process: ``slr.cluster.engines.replica_handles``)."""
        return [(r.name, r.engine) for r in self._replicas]

    # -- Engine protocol ------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._replicas[0].engine.tokenizer

    @property
    def max_context(self) -> int:
        return min(r.engine.max_context for r in self._replicas)

    @property
    def weights_version(self) -> int:
        up = [r for r in self._replicas if r.up] or self._replicas
        return min(r.engine.weights_version for r in up)

    @property
    def weights_versions(self) -> dict[str, int]:
        """Each replica's served weights version (what its engine reports), up or down:
        beside ``published_version``, a replica that fell behind shows."""
        return {r.name: r.engine.weights_version for r in self._replicas}

    @property
    def published_version(self) -> int | None:
        """The version of the latest update sent to the replicas (None before the first)."""
        return None if self._latest is None else self._latest.version

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        tried: set[str] = set()
        while True:
            replica = self._claim(session_id, tried)
            try:
                call = replica.engine.generate(prompt_ids, sampling, session_id=session_id)
                if self._call_timeout_s is not None:
                    return await asyncio.wait_for(call, self._call_timeout_s)
                return await call
            except CLIENT_ERRORS:
                raise
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                reason = self._failure(exc, waited_for="answer")
                self._mark_down(replica, reason)
                self._counts["failovers"] += 1
            finally:
                replica.in_flight -= 1

    def _claim(self, session_id: str | None, tried: set[str]) -> _Replica:
        """The next replica to try for a call (one not in ``tried``), counted as busy with
        it; the caller releases ``in_flight`` when the call ends."""
        replica = self._route(session_id, exclude=tried)
        tried.add(replica.name)
        replica.in_flight += 1
        replica.requests += 1
        return replica

    def _failure(self, exc: Exception, *, waited_for: str) -> str:
        """Why a replica is marked down, for the logs and the failover record."""
        if isinstance(exc, TimeoutError):
            return f"no {waited_for} within {self._call_timeout_s}s"
        return f"{type(exc).__name__}: {exc}"

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        """The session's replica's stream; fails over to another replica before the first
        chunk, ends with ``EngineUnavailable`` if the replica fails after it."""
        tried: set[str] = set()
        while True:
            replica = self._claim(session_id, tried)
            chunks = replica.engine.stream(prompt_ids, sampling, session_id=session_id)
            started = False
            try:
                while True:
                    try:
                        chunk = await self._next_chunk(chunks)
                    except StopAsyncIteration:
                        return
                    started = True
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
            except CLIENT_ERRORS:
                raise
            except Exception as exc:
                reason = self._failure(exc, waited_for="chunk")
                self._mark_down(replica, reason)
                if started:
                    raise EngineUnavailable(
                        f"replica {replica.name} failed mid-stream ({reason}); the tokens "
                        f"already streamed stand, the session moves on its next call"
                    ) from exc
                self._counts["failovers"] += 1
            finally:
                replica.in_flight -= 1
                if isinstance(chunks, ClosableStream):
                    await chunks.aclose()

    async def _next_chunk(self, chunks: AsyncIterator[GenerationChunk]) -> GenerationChunk:
        if self._call_timeout_s is None:
            return await anext(chunks)
        return await asyncio.wait_for(anext(chunks), self._call_timeout_s)

    async def update_weights(
        self,
        state_dict: Mapping[str, Any],
        *,
        version: int | None = None,
        mode: UpdateMode = "drain",
    ) -> int:
        """Update every replica that is up (and every one waiting for an update it could
        not be re-sent), concurrently, to one version: ``version``, else one past the
        newest any replica reports. A replica that fails goes down. The update is kept: a
        replica down now is brought to it before it is readmitted (``_readmit``)."""
        target = version if version is not None else self._next_version()
        shared = self._publish(state_dict) if self._publish is not None else state_dict
        # kept before the replicas are picked, with no await between: a replica readmitted
        # from here on is brought to this update, one readmitted before is among the targets
        self._latest = _Published(weights=shared, version=target, replayable=replayable(shared))
        targets = [r for r in self._replicas if r.up or r.awaiting_update]
        if not targets:
            raise EngineUnavailable(self._none_left_message())
        # "drain" is every engine's default: engines written before the modes keep working
        extra: dict[str, Any] = {} if mode == "drain" else {"mode": mode}
        results = await asyncio.gather(
            *(r.engine.update_weights(shared, version=target, **extra) for r in targets),
            return_exceptions=True,
        )
        versions = []
        for replica, result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                self._mark_down(replica, f"update_weights failed: {result!r}")
                continue
            versions.append(int(result))
            if replica.awaiting_update and not self._closed:
                replica.awaiting_update = False
                self._back_in_service(replica)
        if not versions:
            raise EngineUnavailable("update_weights failed on every replica; see metrics()")
        return min(versions)

    def _next_version(self) -> int:
        known = [r.engine.weights_version for r in self._replicas]
        if self._latest is not None:
            known.append(self._latest.version)
        return max(known) + 1

    async def health(self) -> bool:
        await self.check_health()
        return any(r.up for r in self._replicas)

    async def close(self) -> None:
        self._closed = True
        self._latest = None
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
        await asyncio.gather(*(r.engine.close() for r in self._replicas), return_exceptions=True)
        for r in self._replicas:
            r.up = False

    # -- balancing ------------------------------------------------------------------------

    async def check_health(self) -> dict[str, bool]:
        """Ask every replica; mark the unhealthy ones down and the recovered ones up."""
        answers = await asyncio.gather(*(self._ask(r) for r in self._replicas))
        back = []
        for replica, ok in zip(self._replicas, answers, strict=True):
            if not ok and (replica.up or replica.awaiting_update):
                self._mark_down(replica, "health check failed")
            elif ok and not replica.up:
                back.append(replica)
        await asyncio.gather(*(self._readmit(r) for r in back))
        return {r.name: r.up for r in self._replicas}

    async def probe_down(self) -> list[str]:
        """Ask only the replicas marked down; readmit the healthy ones (each brought to the
        latest published weights first). Returns the names of those readmitted."""
        down = [r for r in self._replicas if self._probed(r)]
        answers = await asyncio.gather(*(self._ask(r) for r in down))
        healthy = [r for r, ok in zip(down, answers, strict=True) if ok]
        readmitted = await asyncio.gather(*(self._readmit(r) for r in healthy))
        return [r.name for r, ok in zip(healthy, readmitted, strict=True) if ok]

    @staticmethod
    def _probed(replica: _Replica) -> bool:
        """Down, and not waiting for the next update nor being brought to the last one."""
        return not replica.up and not replica.awaiting_update and not replica.restoring

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds; it is checked whenever a replica goes down or
        comes back (e.g. ``lambda: balancer.metrics()["replicas"]["a"]["up"]``)."""
        if condition():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((condition, future))
        try:
            await future
        finally:
            self._waiters = [(c, f) for c, f in self._waiters if f is not future]

    @staticmethod
    async def _ask(replica: _Replica) -> bool:
        try:
            return bool(await asyncio.wait_for(replica.engine.health(), HEALTH_TIMEOUT_S))
        except Exception:
            return False

    async def _readmit(self, replica: _Replica) -> bool:
        """Put a replica that answered healthy back into service, once it serves the latest
        published weights: the kept update is sent to it again, as the same version (the
        replica may have missed it, or restarted from its model folder; the engine contract
        cannot say which). Nothing reaches it before that answered. Whether it is up."""
        if replica.up or replica.restoring or self._closed:
            return replica.up
        replica.restoring = True
        try:
            latest = self._latest
            while latest is not None:
                if not latest.replayable:
                    self._await_update(replica, latest)
                    return False
                if not await self._restore(replica, latest):
                    return False
                if self._latest is latest:
                    break
                latest = self._latest  # an update came meanwhile: bring it to that one
            if self._closed or replica.awaiting_update:
                return False
            self._back_in_service(replica)
            return True
        finally:
            replica.restoring = False

    async def _restore(self, replica: _Replica, latest: _Published) -> bool:
        """Send ``latest`` to a replica out of service; whether it now serves that version."""
        log.info(
            "restoring weights before readmission", replica=replica.name, version=latest.version
        )
        try:
            got = int(await replica.engine.update_weights(latest.weights, version=latest.version))
        except Exception as exc:
            replica.failures += 1
            replica.last_error = f"restoring weights version {latest.version} failed: {exc!r}"
            log.warning("replica stays down", replica=replica.name, reason=replica.last_error)
            return False
        if got != latest.version:
            replica.last_error = (
                f"restoring weights version {latest.version}: the replica reports {got}"
            )
            log.warning("replica stays down", replica=replica.name, reason=replica.last_error)
            return False
        self._counts["weights_restored"] += 1
        return True

    def _await_update(self, replica: _Replica, latest: _Published) -> None:
        if replica.awaiting_update:
            return  # said once, when it started waiting
        replica.awaiting_update = True
        replica.last_error = (
            f"healthy, but serves older weights than version {latest.version}, whose update "
            f"cannot be sent again (it reads the trainer's live parameters); out of service "
            f"until the next weight update reaches it"
        )
        log.warning(
            "replica stays out of service until the next weight update",
            replica=replica.name,
            published_version=latest.version,
            served_version=replica.engine.weights_version,
        )

    def _back_in_service(self, replica: _Replica) -> None:
        replica.up = True  # it takes new sessions again; moved ones stay moved
        self._counts["readmissions"] += 1
        log.info(
            "replica readmitted",
            replica=replica.name,
            weights_version=replica.engine.weights_version,
        )
        self._changed()

    def _changed(self) -> None:
        for condition, future in self._waiters:
            if not future.done() and condition():
                future.set_result(None)

    def _watch_down(self) -> None:
        """Start the periodic probe of down replicas, unless it runs (or is off)."""
        if self._probe_interval_s is None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # marked down outside a loop: check_health() still works
            return
        probe = self._probe
        if probe is not None and not probe.done() and probe.get_loop() is loop:
            return
        self._probe = loop.create_task(self._probe_loop(self._probe_interval_s))

    async def _probe_loop(self, interval: float) -> None:
        # a replica being restored counts: if that fails, it stays down and is probed again
        while not self._closed and any(not r.up and not r.awaiting_update for r in self._replicas):
            await asyncio.sleep(interval)  # the probe's period, not a synchronisation
            await self.probe_down()

    def forget(self, session_id: str) -> None:
        """Drop a finished session's pin (the proxy calls this when a session closes)."""
        replica = self._sessions.pop(session_id, None)
        if replica is not None:
            replica.sessions.discard(session_id)

    def replica_of(self, session_id: str) -> str | None:
        replica = self._sessions.get(session_id)
        return replica.name if replica is not None else None

    def metrics(self) -> dict[str, Any]:
        """Per-replica load and the stickiness counters, for logs and the dashboard."""
        return {
            "replicas": {
                r.name: {
                    "up": r.up,
                    "in_flight": r.in_flight,
                    "requests": r.requests,
                    "sessions": len(r.sessions),
                    "failures": r.failures,
                    "last_error": r.last_error,
                    "weights_version": r.engine.weights_version,
                    "awaiting_update": r.awaiting_update,
                }
                for r in self._replicas
            },
            "published_version": self.published_version,
            **self._counts,
            "recent_moves": [
                {
                    "session_id": m.session_id,
                    "from": m.from_replica,
                    "to": m.to_replica,
                    "reason": m.reason,
                    "at": m.at,
                }
                for m in self.moves[-20:]
            ],
        }

    def _route(self, session_id: str | None, *, exclude: set[str]) -> _Replica:
        current = self._sessions.get(session_id) if session_id is not None else None
        if current is not None and current.up and current.name not in exclude:
            self._counts["sticky_hits"] += 1
            self._sessions.move_to_end(session_id)  # type: ignore[arg-type]
            return current
        candidates = [r for r in self._replicas if r.up and r.name not in exclude]
        if not candidates:
            raise EngineUnavailable(self._none_left_message())
        chosen = min(candidates, key=lambda r: (r.in_flight, len(r.sessions)))
        if session_id is None:
            return chosen
        if current is None:
            self._counts["new_sessions"] += 1
        else:
            current.sessions.discard(session_id)
            self._record_move(session_id, current, chosen)
        chosen.sessions.add(session_id)
        self._sessions[session_id] = chosen
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self._max_sessions:
            old_id, old = self._sessions.popitem(last=False)
            old.sessions.discard(old_id)
        return chosen

    def _record_move(self, session_id: str, old: _Replica, new: _Replica) -> None:
        self._counts["moves"] += 1
        self.moves.append(
            SessionMove(
                session_id=session_id,
                from_replica=old.name,
                to_replica=new.name,
                reason=old.last_error or "replica down",
                at=time.time(),
            )
        )
        del self.moves[: -self._max_moves_logged]

    def _mark_down(self, replica: _Replica, reason: str) -> None:
        replica.failures += 1
        replica.last_error = reason
        replica.up = False
        replica.awaiting_update = False
        self._changed()
        self._watch_down()

    def _none_left_message(self) -> str:
        detail = "; ".join(f"{r.name}: {r.last_error or 'down'}" for r in self._replicas)
        return f"no engine replica is up ({detail}); check the engines' logs and health"
