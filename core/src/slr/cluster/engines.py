"""Engine replicas as Ray actors, reached through the ``Engine`` contract.

``EngineActor`` builds the run's engine plugin (``[engine]``) inside its own process, so the
proxy's process no longer decodes: its event loop only routes. ``RayEngine`` is the
driver-side ``Engine`` for one actor, and ``start_engine_replicas`` starts
``[run] engine_replicas`` of them (placed by ``[run] engine_resources``) behind the load
balancer.

What crosses the process boundary is plain data (docs/engines.md, "An engine in its own
process"): prompt ids, ``SamplingParams``, chunks, generations. Errors the balancer and the proxy decide
on (``ContextOverflow``, ``ValueError``, ``EngineUnavailable``) travel as a ``_Failure``
record and are raised again, as the same type, on the driver's side; a replica that is gone
(killed, crashed, its node lost) surfaces as ``EngineUnavailable``, which makes the balancer
move the session. ``generate`` is one actor call (one reply: the whole generation);
a stream's chunks come through a Ray streaming generator; a consumer that
stops cancels the actor's task, which closes the engine's stream at its next token boundary.
One Ray object carries every token sampled since the consumer took the previous one
(``_Coalescer``), not one token each.

Other processes reach the same replicas: ``replica_handles`` gives each replica's actor
handle and description (plain data that Ray sends anywhere), and ``attach_replicas`` builds
a balancer over them in another process (a rollout worker's node-local proxy) that does not
own them: closing it ends no replica, and the driver's balancer alone publishes weights.

Weights: ``update_weights`` on the balancer puts the state dict into Ray's object store once
(the balancer's ``publish`` step) and every replica receives that one reference. A replica
that Ray restarts after a crash starts from the model folder; before it is admitted again
(its ``health``) it is brought to the latest published weights from that same reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import structlog
from attrs import frozen

from slr.cluster import ray_runtime
from slr.contracts import (
    ClosableStream,
    ContextOverflow,
    Engine,
    EngineUnavailable,
    Generation,
    GenerationChunk,
    SamplingParams,
    StatsReporting,
    UpdateMode,
)
from slr.contracts.engine import ChunkCollector
from slr.contracts.weights import portable
from slr.engines.balancer import LoadBalancer
from slr.errors import UsageError

log = structlog.get_logger()

#: Seconds a replica may take to start (process, model load) before the run gives up.
START_TIMEOUT_S = 600.0
#: Seconds a health probe waits for a replica's answer.
HEALTH_TIMEOUT_S = 30.0
#: How often Ray restarts a replica whose process died, before it stays down.
MAX_RESTARTS = 3


@frozen(kw_only=True)
class _Failure:
    """An error raised in the actor, as data, so it is raised again as its own type."""

    kind: str  # "context_overflow" | "value" | "unavailable"
    message: str
    prompt_tokens: int = 0
    max_context: int = 0

    @classmethod
    def of(cls, exc: BaseException) -> _Failure:
        if isinstance(exc, ContextOverflow):
            return cls(
                kind="context_overflow",
                message=str(exc),
                prompt_tokens=exc.prompt_tokens,
                max_context=exc.max_context,
            )
        if isinstance(exc, ValueError | TypeError):
            return cls(kind="value", message=str(exc))
        return cls(kind="unavailable", message=f"{type(exc).__name__}: {exc}")

    def error(self, replica: str) -> Exception:
        if self.kind == "context_overflow":
            return ContextOverflow(self.prompt_tokens, self.max_context)
        if self.kind == "value":
            return ValueError(self.message)
        return EngineUnavailable(f"engine replica {replica}: {self.message}")


def _ray_method(**options: Any) -> Any:
    """``ray.method(**options)`` where Ray is installed (this module is imported only when a
    run uses Ray, but its names are read by tests and docs without it)."""
    try:
        import ray
    except ImportError:
        return lambda fn: fn
    return ray.method(**options)


class EngineActor:
    """The body of one engine replica (wrapped by ``ray.remote`` in ``start_engine_replicas``).

    Built from the run config as plain data (``Config.to_dict()``), with the engine plugin
    looked up in this process's own plugin manager, exactly as the driver would build it.
    """

    def __init__(self, config_data: dict[str, Any], name: str) -> None:
        from slr.config import load_config
        from slr.plugins import get_plugin_manager

        plugins = get_plugin_manager()
        config = load_config(data=config_data, plugins=plugins, only_plugins=("engine",))
        self.name = name
        self.engine = plugins.build(config, "engine")

    def describe(self) -> dict[str, Any]:
        """What the driver keeps so that reading these costs no round trip."""
        import ray

        return {
            "tokenizer": self.engine.tokenizer,
            "max_context": int(self.engine.max_context),
            "weights_version": int(self.engine.weights_version),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "nice": os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else 0,
        }

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None
    ) -> Generation | _Failure:
        """A whole generation as one reply: one Ray round trip for a call that is not
        streamed (cancelling this task closes the engine's stream, as for ``stream``)."""
        try:
            return await self.engine.generate(prompt_ids, sampling, session_id=session_id)
        except Exception as exc:  # as data: the driver raises it again as its own type
            return _Failure.of(exc)

    # One object in flight per stream: the generator waits at its yield until the consumer
    # has taken the previous chunk, and the tokens sampled meanwhile go out as one object.
    @_ray_method(_generator_backpressure_num_objects=1)
    async def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None
    ) -> AsyncIterator[GenerationChunk | _Failure]:
        chunks = self.engine.stream(prompt_ids, sampling, session_id=session_id)
        pending = _Coalescer(chunks)
        try:
            while True:
                item = await pending.take()
                yield item
                if isinstance(item, _Failure) or item.finish_reason is not None:
                    return
        finally:
            # Also reached when the driver cancels this task (its consumer went away):
            # closing the engine's stream frees the sequence at the next token boundary.
            await pending.close()

    async def update_weights(
        self, state_dict: Mapping[str, Any], version: int | None, mode: UpdateMode
    ) -> int | _Failure:
        try:
            extra: dict[str, UpdateMode] = {} if mode == "drain" else {"mode": mode}
            return int(await self.engine.update_weights(state_dict, version=version, **extra))
        except Exception as exc:
            return _Failure.of(exc)

    async def weights_version(self) -> int:
        return int(self.engine.weights_version)

    async def health(self) -> bool:
        return bool(await self.engine.health())

    async def stats(self) -> dict[str, Any]:
        return dict(self.engine.stats()) if isinstance(self.engine, StatsReporting) else {}

    async def close(self) -> None:
        await self.engine.close()


class _Coalescer:
    """Reads an engine's stream as fast as it yields and hands out everything read since
    the last ``take`` as one chunk: at 32 sessions a Ray object per token (each one a
    report to the consumer's process and a wake-up of its event loop) cost more CPU than
    the proxy itself on a two-core machine."""

    def __init__(self, chunks: AsyncIterator[GenerationChunk]) -> None:
        self._chunks = chunks
        self._buffer: list[GenerationChunk] = []
        self._failure: _Failure | None = None
        self._ended = False
        self._ready = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for chunk in self._chunks:
                self._buffer.append(chunk)
                self._ready.set()
                if chunk.finish_reason is not None:
                    break
        except Exception as exc:  # as data: the driver raises it again as its own type
            self._failure = _Failure.of(exc)
        finally:
            self._ended = True
            self._ready.set()

    async def take(self) -> GenerationChunk | _Failure:
        """The chunks read since the last call, merged (waits for at least one); then a
        failure, if the stream failed; the end of the stream without a final chunk is
        a failure too."""
        while not self._buffer and not self._ended:
            self._ready.clear()
            await self._ready.wait()
        if self._buffer:
            merged, self._buffer = merge_chunks(self._buffer), []
            return merged
        if self._failure is not None:
            return self._failure
        return _Failure.of(EngineUnavailable("the engine's stream ended without a final chunk"))

    async def close(self) -> None:
        if not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if isinstance(self._chunks, ClosableStream):
            await self._chunks.aclose()


def merge_chunks(chunks: Sequence[GenerationChunk]) -> GenerationChunk:
    """Consecutive chunks of one stream as one chunk (tokens, log-probs, versions and
    routing concatenated; the last one's finish reason)."""
    if len(chunks) == 1:
        return chunks[0]
    collector = ChunkCollector()
    for chunk in chunks:
        collector.add(chunk)
    return GenerationChunk(
        token_ids=collector.token_ids,
        logprobs=collector.logprobs,
        weights_versions=collector.weights_versions,
        routed_experts=collector.routed_experts,
        finish_reason=collector.finish_reason,
        prompt_tokens=collector.prompt_tokens,
    )


@frozen(kw_only=True)
class ReplicaHandle:
    """One engine replica as plain data: what another process needs to reach it."""

    name: str
    actor: Any  # the Ray actor handle
    info: Mapping[str, Any]  # what ``EngineActor.describe`` answered


class RayEngine:
    """Implements ``slr.contracts.Engine`` for one ``EngineActor``.

    ``tokenizer`` and ``max_context`` are read once when the replica starts;
    ``weights_version`` follows the versions the replica reports (with each update and in
    every chunk), so none of the three costs a round trip. ``owner``: closing it ends the
    actor (the driver's replicas); a rollout worker's view of a replica is not the owner.
    """

    def __init__(
        self,
        actor: Any,
        info: Mapping[str, Any],
        *,
        name: str,
        connection: ray_runtime.Connection | None = None,
        owner: bool = True,
    ) -> None:
        self.actor = actor
        self.name = name
        self.info = dict(info)
        self.owner = owner
        self.node_id: str = info["node_id"]
        self.pid: int = info["pid"]
        self._tokenizer = info["tokenizer"]
        self._max_context = int(info["max_context"])
        self._version = int(info["weights_version"])
        self._connection = connection
        self._published: tuple[Any, int] | None = None  # (object ref, version) last pushed
        self._closed = False

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def weights_version(self) -> int:
        return self._version

    def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        return self._stream([int(t) for t in prompt_ids], sampling, session_id)

    async def _stream(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None
    ) -> AsyncIterator[GenerationChunk]:
        import ray
        from ray.exceptions import RayError

        if self._closed:
            raise EngineUnavailable(f"engine replica {self.name} is closed")
        calls = self.actor.stream.remote(prompt_ids, sampling, session_id)
        finished = False
        try:
            async for ref in calls:
                try:
                    item = await ref
                except RayError as exc:
                    finished = True
                    raise self._gone(exc) from exc
                if isinstance(item, _Failure):
                    finished = True
                    raise item.error(self.name)
                if item.weights_versions:
                    self._version = max(self._version, item.weights_versions[-1])
                finished = item.finish_reason is not None
                yield item
                if finished:
                    return
            finished = True
            raise EngineUnavailable(
                f"engine replica {self.name} ended a stream without a final chunk"
            )
        except RayError as exc:
            finished = True
            raise self._gone(exc) from exc
        finally:
            if not finished:
                # The consumer went away: cancel the actor's task (an asyncio cancel there).
                ray.cancel(calls)

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        """One actor call that returns the whole generation: a single Ray reply, not a
        stream of objects each reported, acknowledged and awaited on the proxy's loop."""
        import ray
        from ray.exceptions import RayError

        if self._closed:
            raise EngineUnavailable(f"engine replica {self.name} is closed")
        ref = self.actor.generate.remote([int(t) for t in prompt_ids], sampling, session_id)
        try:
            item = await ref
        except RayError as exc:
            raise self._gone(exc) from exc
        except asyncio.CancelledError:
            # The caller went away (its client, or its session closed): cancel the actor's
            # task, which closes the engine's stream at the next token boundary.
            ray.cancel(ref)
            raise
        if isinstance(item, _Failure):
            raise item.error(self.name)
        if item.weights_versions:
            self._version = max(self._version, item.weights_versions[-1])
        return item

    async def update_weights(
        self,
        state_dict: Any,
        *,
        version: int | None = None,
        mode: UpdateMode = "drain",
    ) -> int:
        """``state_dict``: a mapping of tensors, or an object reference to one (what the
        balancer passes: put once, shared by every replica)."""
        import ray
        from ray.exceptions import RayError

        ref = state_dict if isinstance(state_dict, ray.ObjectRef) else ray.put(portable(state_dict))
        try:
            result = await self.actor.update_weights.remote(ref, version, mode)
        except RayError as exc:
            raise self._gone(exc) from exc
        if isinstance(result, _Failure):
            raise result.error(self.name)
        self._version = int(result)
        self._published = (ref, self._version)
        return self._version

    async def health(self) -> bool:
        """True when the actor answers and serves the latest published weights (a replica
        Ray restarted is first brought to them)."""
        from ray.exceptions import RayError

        if self._closed:
            return False
        try:
            ok = await asyncio.wait_for(self.actor.health.remote(), HEALTH_TIMEOUT_S)
            version = await asyncio.wait_for(self.actor.weights_version.remote(), HEALTH_TIMEOUT_S)
            if ok and self._published is not None and version != self._published[1]:
                ref, expected = self._published
                log.info("engine replica restarted; restoring weights", replica=self.name)
                result = await self.actor.update_weights.remote(ref, expected, "drain")
                ok = not isinstance(result, _Failure)
            return bool(ok)
        except (RayError, TimeoutError):
            return False

    async def stats(self) -> dict[str, Any]:
        """The engine's own counters (the hf engine's ``stats()``), fetched from the actor."""
        return await self.actor.stats.remote()

    async def close(self) -> None:
        """Stop the engine, then end the actor's process."""
        import ray
        from ray.exceptions import RayError

        if self._closed:
            return
        self._closed = True
        if not self.owner:
            return
        try:
            await asyncio.wait_for(self.actor.close.remote(), 60)
        except (RayError, TimeoutError):
            pass  # already gone, or hung: the kill below ends it either way
        ray.kill(self.actor)
        if self._connection is not None:
            self._connection.release()

    def _gone(self, exc: BaseException) -> EngineUnavailable:
        return EngineUnavailable(
            f"engine replica {self.name} is unavailable ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        )


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray actor options for one replica asking for ``resources`` ({CPU = 1}, {GPU = 1},
    custom ones); Ray's own CPU / GPU keys become ``num_cpus`` / ``num_gpus``."""
    custom = {k: float(v) for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {
        "num_cpus": float(resources.get("CPU", 0)),
        "num_gpus": float(resources.get("GPU", 0)),
        **({"resources": custom} if custom else {}),
    }


def check_placeable(
    resources: Mapping[str, float],
    replicas: int,
    *,
    what: str = "run.engine_resources",
    count_key: str | None = "engine_replicas",
) -> None:
    """Fail at once, naming the resource, when the cluster can never hold ``replicas``
    actors asking ``resources`` each (Ray itself would wait forever for an infeasible
    actor). ``what`` / ``count_key``: the config keys the message names."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for key, amount in resources.items():
        per_node = [float(n.get(key, 0)) for n in nodes]
        total = sum(int(capacity // amount) if amount else replicas for capacity in per_node)
        if total < replicas:
            have = ", ".join(f"{c:g}" for c in sorted(per_node, reverse=True)) or "no nodes"
            lower = f"lower run.{count_key}, " if count_key else ""
            raise UsageError(
                f"{what} asks {key} = {amount:g} for each of {replicas} "
                f"{(count_key or 'actor').replace('_', ' ')}, but the Ray cluster's nodes "
                f"have {key}: {have}; {lower}change {what}, or add nodes"
            )


def build_engine(config: Any, plugins: Any) -> Engine:
    """The run's engine: the ``[engine]`` plugin built in this process, or with
    ``[run] engine_replicas >= 1`` that many Ray actors, each building the plugin in its own
    process, behind the load balancer (``start_engine_replicas``)."""
    if config.run.engine_replicas >= 1:
        return start_engine_replicas(config)
    return plugins.build(config, "engine")


def start_engine_replicas(
    config: Any, *, call_timeout_s: float | None = None, probe_interval_s: float = 10.0
) -> LoadBalancer:
    """``config.run.engine_replicas`` engine actors behind a ``LoadBalancer``.

    Connects to Ray (``config.run.ray_address``), starts the actors where
    ``config.run.engine_resources`` fits, waits until each has loaded its engine, and
    returns the balancer; closing it kills the actors and releases the Ray connection.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    run = config.run
    count = int(run.engine_replicas)
    if count < 1:
        raise ValueError(f"engine_replicas = {count}: replicas start only for 1 or more")
    connection = ray_runtime.connect(run.ray_address)
    try:
        resources = dict(run.engine_resources)
        check_placeable(resources, count)
        remote = ray.remote(EngineActor)
        data = config.to_dict()
        names = [f"engine-{i}" for i in range(count)]
        actors: list[Any] = [
            remote.options(  # pyright: ignore[reportAttributeAccessIssue]
                max_restarts=MAX_RESTARTS, **actor_options(resources)
            ).remote(data, name)
            for name in names
        ]
        try:
            infos = ray.get([a.describe.remote() for a in actors], timeout=START_TIMEOUT_S)
        except GetTimeoutError:
            for a in actors:
                ray.kill(a)
            raise UsageError(
                f"{count} engine replica(s) asking {resources} each did not start within "
                f"{START_TIMEOUT_S:g}s; the cluster has {ray.available_resources()} free. "
                f"Lower run.engine_replicas or change run.engine_resources"
            ) from None
        except RayError as exc:
            for a in actors:
                ray.kill(a)
            raise EngineUnavailable(f"an engine replica failed to start: {exc}") from exc
    except BaseException:
        connection.release()
        raise
    engines = []
    for i, (name, actor, info) in enumerate(zip(names, actors, infos, strict=True)):
        # One hold on the connection per replica; the first is the one taken above.
        hold = connection if i == 0 else ray_runtime.connect(run.ray_address)
        engines.append(RayEngine(actor, info, name=name, connection=hold))
    log.info(
        "engine replicas ready",
        replicas=count,
        nodes=sorted({e.node_id[:12] for e in engines}),
        resources=resources,
    )
    return LoadBalancer(
        engines,
        names=names,
        call_timeout_s=call_timeout_s,
        publish=share_weights,
        probe_interval_s=probe_interval_s,
    )


def share_weights(state_dict: Any) -> Any:
    """The state dict in Ray's object store, once: every replica receives this reference.
    A reference already (a remote trainer's export) is passed on as it is."""
    import ray

    if isinstance(state_dict, ray.ObjectRef):
        return state_dict
    return ray.put(portable(state_dict))


def replica_handles(engine: Any) -> list[ReplicaHandle]:
    """The Ray replicas behind ``engine`` (a balancer from ``start_engine_replicas``), as
    plain data for another process; empty when the engine is not made of Ray replicas."""
    if not isinstance(engine, LoadBalancer):
        return []
    return [
        ReplicaHandle(
            name=name, actor=e.actor, info={**e.info, "weights_version": e.weights_version}
        )
        for name, e in engine.replicas
        if isinstance(e, RayEngine)
    ]


def attach_replicas(
    handles: Sequence[ReplicaHandle], *, probe_interval_s: float | None = 10.0
) -> LoadBalancer:
    """A balancer over replicas another process started (it does not own them)."""
    engines = [RayEngine(h.actor, h.info, name=h.name, owner=False) for h in handles]
    return LoadBalancer(engines, names=[h.name for h in handles], probe_interval_s=probe_interval_s)
