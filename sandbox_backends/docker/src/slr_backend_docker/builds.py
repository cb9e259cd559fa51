"""Building a task set's images: every task once, several at a time, failures logged.

``slr images build`` runs this. Each image goes through ``DockerBackend.ensure_image``, the
same path a trial's ``prepare`` takes, so a tag built here is the tag a run finds (never
built twice: the content hash names it) and a run never builds anything differently.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from attrs import frozen

from slr.contracts import BrokenEnvironment, SandboxError
from slr_backend_docker import registry

Status = Literal["built", "cached", "pulled", "failed"]


@frozen(kw_only=True)
class BuildResult:
    """One task's image: what happened, how long it took, and where to look when it failed."""

    task_id: str
    tag: str
    status: Status
    seconds: float
    error: str = ""
    log: str = ""
    """The build log's file, for a failed build."""
    pushed: str = ""
    """The registry reference the image was pushed to (``--push``)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "tag": self.tag,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "log": self.log,
            "pushed": self.pushed,
        }


def log_name(task_id: str) -> str:
    """A file name for a task's build log: the id, or (for an id holding ``/`` or other
    characters a file name should not) a cleaned id plus a short hash of the original, so two
    such ids never share a log."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", task_id).strip("._")
    if clean == task_id:
        return clean
    return f"{clean or 'task'}-{hashlib.sha256(task_id.encode()).hexdigest()[:8]}"


async def build_images(
    backend: Any,
    tasks: Iterable[Any],
    *,
    jobs: int = 4,
    log_dir: Path,
    push: str = "",
    on_start: Callable[[Any], None] | None = None,
    on_done: Callable[[BuildResult], None] | None = None,
) -> list[BuildResult]:
    """Ensure every task's image, ``jobs`` at a time; results in the tasks' order.

    A failed build writes its log to ``log_dir/<task>.log`` and the others go on. With
    ``push``, every image that exists afterwards (built or cached; a task's own prebuilt
    ``docker_image`` excepted) is pushed to that registry prefix.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    gate = asyncio.Semaphore(jobs)

    async def one(task: Any) -> BuildResult:
        async with gate:
            if on_start is not None:
                on_start(task)
            result = await _build_one(backend, task, log_dir=log_dir, push=push)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(t) for t in tasks)))


async def _build_one(backend: Any, task: Any, *, log_dir: Path, push: str) -> BuildResult:
    tag = backend.image_tag(task)
    t0 = time.monotonic()
    try:
        status = await backend.ensure_image(task)
    except SandboxError as exc:
        build_log = exc.build_log if isinstance(exc, BrokenEnvironment) else ""
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"{log_name(task.id)}.log"
        path.write_text(f"{exc}\n\n{build_log}\n" if build_log else f"{exc}\n")
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return BuildResult(
            task_id=task.id,
            tag=tag,
            status="failed",
            seconds=time.monotonic() - t0,
            error=first,
            log=str(path),
        )
    pushed = ""
    if status == "pulled" and push == backend.config.registry:
        pushed = registry.registry_ref(push, tag)  # that is where it came from
    elif push and not task.environment.docker_image:
        try:
            pushed = await backend.call(registry.push, backend.client.api, tag, push)
        except SandboxError as exc:  # the registry's refusal, or the daemon's
            return BuildResult(
                task_id=task.id,
                tag=tag,
                status="failed",
                seconds=time.monotonic() - t0,
                error=str(exc),
            )
    return BuildResult(
        task_id=task.id, tag=tag, status=status, seconds=time.monotonic() - t0, pushed=pushed
    )


def summary(results: list[BuildResult]) -> dict[str, int]:
    """How many images were built, cached, pulled and failed."""
    counts = {"built": 0, "cached": 0, "pulled": 0, "failed": 0}
    for r in results:
        counts[r.status] += 1
    return counts
