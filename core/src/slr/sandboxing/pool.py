"""A warm sandbox pool: sandboxes for the next trials started ahead of need, up to a bound.

``SandboxPool`` wraps any ``SandboxBackend`` and is one itself, so the trial runner does
not know it is there. The trial recorder tells it which tasks come next (``expect``); it
keeps up to ``size`` sandboxes for them starting or running, and ``start`` hands out one
already running for the trial's task (or starts one, as the backend would, when none is).
The backends only start and stop sandboxes; everything here is theirs to share.

Safety, which the pool tests hold it to:

- fresh: a pooled sandbox is started from the task's image for one trial and handed out
  once; the trial stops it, so nothing of a trial reaches another;
- never broken: before a hand-out the sandbox's ``healthy()`` (or a ``true`` exec) is asked;
  a broken one is stopped and a new one started in its place;
- nothing left: ``close`` (the end of a run) stops every idle sandbox and every start in
  flight; after a SIGKILL the sandboxes carry the backend's owner labels, so the next
  run's ``cleanup_orphans`` removes them;
- no hidden cost: a sandbox's CPU meter runs from its creation, so what it used waiting in
  the pool is charged to the trial it serves, and ``pool_start_s`` records the wall time
  the pool spent starting it.

``prestart`` (the agent's, optional) runs on each pooled sandbox once it is up, before its
trial is known: an agent starts its scaffold's interpreter there ahead of the trial
(``slr.agents.prestart``). What it returns travels with the sandbox as ``prestarted``; a
prestart that fails leaves the sandbox as it is (the trial starts its scaffold afresh).

Pooled sandboxes are started before their trial is known: they carry the run's labels, the
task's, ``labels.POOL`` and a placeholder trial id (``pool-<hex>``), not the trial's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from slr.contracts import HealthChecked, Sandbox
from slr.sandboxing.labels import POOL, trial_labels

log = structlog.get_logger()


class PooledSandbox:
    """A sandbox from the pool: the backend's own, plus how long the pool spent starting it
    and what the agent's ``prestart`` left in it (``prestarted``; None without)."""

    def __init__(self, inner: Any, pool_start_s: float, prestarted: Any = None) -> None:
        self.inner = inner
        self.id = inner.id
        self.pool_start_s = pool_start_s
        self.prestarted = prestarted

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def exec(self, command: Any, **kwargs: Any) -> Any:
        return await self.inner.exec(command, **kwargs)

    async def upload(self, src: Path, dest: str) -> None:
        await self.inner.upload(src, dest)

    async def download(self, src: str, dest: Path) -> None:
        await self.inner.download(src, dest)

    def proxy_url(self, host_url: str) -> str:
        return self.inner.proxy_url(host_url)

    async def set_network(self, mode: Any) -> None:
        await self.inner.set_network(mode)

    async def end_processes(self) -> None:
        await self.inner.end_processes()

    async def stop(self) -> None:
        await self.inner.stop()


class _Warm:
    """One pooled sandbox, starting or started (``start``: set once, by the pool's fill)."""

    start: asyncio.Future[Any]

    def __init__(self, task: Any) -> None:
        self.task = task
        self.began = time.monotonic()
        self.ready_at: float | None = None
        self.prestarted: Any = None


async def is_healthy(sandbox: Sandbox) -> bool:
    """The sandbox's own ``healthy()``, else whether ``true`` runs in it."""
    try:
        if isinstance(sandbox, HealthChecked):
            return bool(await sandbox.healthy())
        return (await sandbox.exec("true", timeout_s=10)).ok
    except Exception:
        return False


class SandboxPool:
    """A ``SandboxBackend`` that keeps up to ``size`` sandboxes warm for the expected tasks.

    ``mounts`` are the read-only mounts every trial of the run asks for (the agent's bundle):
    a ``start`` asking for other mounts gets a sandbox of its own. ``labels`` (the run's)
    go on every pooled sandbox. ``prestart(sandbox)`` (the agent's) runs on each pooled
    sandbox once it is up; its result is the handed-out sandbox's ``prestarted``.
    """

    def __init__(
        self,
        backend: Any,
        *,
        size: int,
        mounts: Mapping[Path, str] | None = None,
        run_id: str | None = None,
        prestart: Callable[[Any], Awaitable[Any]] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a sandbox pool needs size >= 1, got {size}; use no pool for 0")
        self.backend = backend
        self.size = size
        self.mounts = dict(mounts or {})
        self.run_id = run_id
        self.prestart = prestart
        self.pool_id = uuid.uuid4().hex[:8]
        self._demand: collections.deque[Any] = collections.deque()
        self._warm: list[_Warm] = []
        self._closed = False
        self.replaced = 0  # broken sandboxes stopped instead of handed out

    # -- the backend's own calls -------------------------------------------------------------

    async def prepare(self, task: Any) -> None:
        await self.backend.prepare(task)

    async def cleanup_orphans(self) -> int:
        return await self.backend.cleanup_orphans()

    async def close(self) -> None:
        """Shrink to nothing (idle sandboxes stopped, starts cancelled), then close the backend."""
        try:
            await self.drain()
        finally:
            await self.backend.close()

    # -- the pool ----------------------------------------------------------------------------

    def expect(self, tasks: Sequence[Any]) -> None:
        """The tasks of the trials about to run, in order: the pool starts sandboxes for them."""
        self._demand.extend(tasks)
        self._fill()

    @property
    def warm(self) -> int:
        """Sandboxes the pool holds now, starting or ready."""
        return len(self._warm)

    async def wait_ready(self) -> None:
        """Return once every start in flight has finished (for tests and benchmarks)."""
        await asyncio.gather(*(w.start for w in list(self._warm)), return_exceptions=True)

    async def drain(self) -> None:
        """Stop every sandbox the pool holds and forget what it expected."""
        self._closed = True
        self._demand.clear()
        warm, self._warm = self._warm, []
        await asyncio.gather(*(self._discard(w) for w in warm))

    async def start(
        self,
        task: Any,
        *,
        trial_id: str,
        labels: Mapping[str, str],
        mounts: Mapping[Path, str] | None = None,
    ) -> Any:
        """A running sandbox for ``task``: a warm one when the pool has one, else a new one."""
        warm = self._take(task) if dict(mounts or {}) == self.mounts else None
        if warm is None:
            self._forget(task)
            sandbox = await self.backend.start(
                task, trial_id=trial_id, labels=labels, mounts=mounts
            )
            self._fill()
            return sandbox
        self._fill()
        try:
            sandbox = await asyncio.shield(warm.start)
        except asyncio.CancelledError:
            await self._discard(warm)
            raise
        except Exception as exc:
            log.warning("pooled sandbox failed to start; starting one now", error=repr(exc))
            sandbox = None
        if sandbox is not None and await is_healthy(sandbox):
            ended = warm.ready_at or time.monotonic()
            return PooledSandbox(
                sandbox, pool_start_s=ended - warm.began, prestarted=warm.prestarted
            )
        if sandbox is not None:
            self.replaced += 1
            log.warning("pooled sandbox is broken; replacing it", sandbox=str(sandbox.id)[:12])
            with contextlib.suppress(Exception):
                await sandbox.stop()
        return await self.backend.start(task, trial_id=trial_id, labels=labels, mounts=mounts)

    def _take(self, task: Any) -> _Warm | None:
        for i, w in enumerate(self._warm):
            if w.task.id == task.id:
                return self._warm.pop(i)
        return None

    def _forget(self, task: Any) -> None:
        """A trial started without the pool: the demand it stood for is met."""
        for i, t in enumerate(self._demand):
            if t.id == task.id:
                del self._demand[i]
                return

    def _fill(self) -> None:
        while not self._closed and self._demand and len(self._warm) < self.size:
            task = self._demand.popleft()
            warm = _Warm(task)
            warm.start = asyncio.ensure_future(self._start_one(warm))
            self._warm.append(warm)

            def ready(_: Any, w: _Warm = warm) -> None:
                w.ready_at = time.monotonic()

            warm.start.add_done_callback(ready)

    async def _start_one(self, warm: _Warm) -> Any:
        placeholder = f"pool-{self.pool_id}-{uuid.uuid4().hex[:8]}"
        labels = trial_labels(run_id=self.run_id, trial_id=placeholder, task_id=warm.task.id)
        labels[POOL] = self.pool_id
        sandbox = await self.backend.start(
            warm.task, trial_id=placeholder, labels=labels, mounts=self.mounts
        )
        if self.prestart is None:
            return sandbox
        try:
            warm.prestarted = await self.prestart(sandbox)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await sandbox.stop()
            raise
        except Exception as exc:  # the trial starts its scaffold afresh
            log.warning("prestarting the agent in a pooled sandbox failed", error=repr(exc))
        return sandbox

    async def _discard(self, warm: _Warm) -> None:
        if not warm.start.done():
            warm.start.cancel()  # the backend's start removes what it made
        await asyncio.wait([warm.start])
        if warm.start.cancelled() or warm.start.exception() is not None:
            return
        with contextlib.suppress(Exception):
            await warm.start.result().stop()
