"""The docker backend: images per task (cached by content hash), one container per trial.

Networking: every container starts with ``--network none`` — only its own loopback. The
agent reaches the proxy through a relay (``slr.sandboxing.relay``, the container's PID 1)
that listens on ``127.0.0.1:<proxy_port>`` and forwards to a unix socket bind-mounted from
the host (``slr.sandboxing.ProxyLink``). Nothing else, host or LAN or other containers, can
be reached. For the verifier phase the link is cut, and a task that allows internet access
is moved onto docker's default bridge.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import structlog

from slr.contracts import BrokenEnvironment, SandboxError
from slr.sandboxing import ProxyLink, pid_alive, remove_stale_links
from slr.sandboxing.exec_channel import SOCKET_NAME as EXEC_SOCKET
from slr.sandboxing.exec_channel import ExecChannel, ExecListener
from slr.sandboxing.labels import OWNER_HOST, OWNER_PID, SANDBOX, trial_labels
from slr_backend_docker import registry
from slr_backend_docker.client import (
    DaemonUnreachable,
    connect,
    daemon_unreachable,
    transport_errors,
)
from slr_backend_docker.config import DockerBackendConfig
from slr_backend_docker.sandbox import DockerSandbox
from slr_backend_docker.tags import image_tag, task_image_labels

log = structlog.get_logger()
T = TypeVar("T")
#: Where ``ensure_image`` found a task's image.
ImageSource = Literal["cached", "pulled", "built"]

LINK_MOUNT = "/run/slr"


# The SDK blocks, and a sandbox can hold several threads at the same moment: a command's
# output stream for its whole run, the exec that kills it when it times out, and a file
# transfer or state check beside them. Threads start only when needed, so the bound costs
# nothing while unused.
THREADS_PER_SANDBOX = 3
MIN_THREADS = 32


def thread_count(sandboxes: int) -> int:
    """Threads for ``sandboxes`` live at once, so no call ever waits for another's thread."""
    return max(MIN_THREADS, THREADS_PER_SANDBOX * sandboxes)


class DockerBackend:
    """``SandboxBackend`` on a docker daemon (local socket or ``DOCKER_HOST``).

    ``sandboxes`` is how many sandboxes the caller keeps alive at once (a run's
    ``[rollout] concurrency`` plus its ``pool_size``: ``from_config``); the backend's thread
    pool is sized to it, so a timed-out command's kill never queues behind other trials'
    running commands.
    """

    def __init__(self, config: DockerBackendConfig | None = None, *, sandboxes: int = 16) -> None:
        self.config = config or DockerBackendConfig()
        self._client: Any = None
        self.threads = thread_count(sandboxes)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.threads, thread_name_prefix="slr-docker"
        )
        # per event loop: an asyncio.Lock belongs to the loop that first waits on it
        self._build_locks: dict[tuple[int, str], asyncio.Lock] = {}
        self._build_failures: dict[str, BrokenEnvironment] = {}

    @classmethod
    def from_config(cls, config: Any) -> DockerBackend:
        """The backend of a run: ``[backend]`` options, sized to ``[rollout]``."""
        rollout = config.rollout
        return cls(config.backend.options, sandboxes=rollout.concurrency + rollout.pool_size)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect(self.config.base_url)
        return self._client

    async def call(self, fn, *args, **kwargs):
        """Run a blocking SDK call on the backend's threads; a daemon that does not answer
        is a ``SandboxError`` (an infrastructure failure, never the agent's)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))
        except transport_errors() as exc:
            # the SDK's own base_url for a unix socket is "http+docker://localhost"
            where = self.config.base_url or os.environ.get("DOCKER_HOST") or "the local socket"
            raise daemon_unreachable(where, fn, exc) from exc

    # -- images --------------------------------------------------------------------------

    def image_tag(self, task: Any) -> str:
        return image_tag(self.config.image_prefix, task)

    async def prepare(self, task: Any) -> None:
        """Build the task's image unless an image with its content hash exists."""
        await self.ensure_image(task)

    async def ensure_image(self, task: Any) -> ImageSource:
        """Make the task's image exist on the daemon; say where it came from.

        The one path that builds a task image: trials (``prepare``, ``start``), ``slr images
        build`` and the k8s backend's builder all come here. ``cached``: the tag (content
        hash) was already there and nothing ran; ``pulled``: from ``registry``; ``built``:
        from the Dockerfile (and pushed to ``registry`` when one is set).
        """
        return await self._when_daemon_answers(lambda: self._ensure(task))

    async def _ensure(self, task: Any) -> ImageSource:
        tag = self.image_tag(task)
        if tag in self._build_failures:
            raise self._build_failures[tag]
        lock = self._build_locks.setdefault((id(asyncio.get_running_loop()), tag), asyncio.Lock())
        async with lock:
            if await self.call(self._image_exists, tag):
                return "cached"
            if task.environment.docker_image:
                raise BrokenEnvironment(
                    f"task {task.id}: image {tag!r} (environment.docker_image) is not on the "
                    f"daemon and slr does not pull; load it first (docker load / docker pull)"
                )
            if self.config.registry and await self.call(self._pull, tag):
                return "pulled"
            try:
                await asyncio.wait_for(
                    self.call(self._build, task, tag), timeout=task.environment.build_timeout_s
                )
            except TimeoutError:
                raise BrokenEnvironment(
                    f"task {task.id}: image build ran past environment.build_timeout_sec = "
                    f"{task.environment.build_timeout_s:g}s"
                ) from None
            except BrokenEnvironment as exc:
                self._build_failures[tag] = exc
                raise
            if self.config.registry:
                await self.call(self._push, tag)
            return "built"

    def _pull(self, tag: str) -> bool:
        try:
            return registry.pull(self.client.api, tag, self.config.registry)
        except registry.RegistryError as exc:
            # the registry is a shared cache: without it the image is built here instead
            log.warning("registry did not answer; building the image here", error=str(exc))
            return False

    def _push(self, tag: str) -> None:
        try:
            registry.push(self.client.api, tag, self.config.registry)
        except registry.RegistryError as exc:
            # the image is here and the trial can run; other machines will build their own
            log.warning("could not push the built image", error=str(exc))

    def _image_exists(self, tag: str) -> bool:
        import docker.errors

        try:
            self.client.images.get(tag)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker daemon error looking up image {tag}: {exc}") from exc
        return True

    def _build(self, task: Any, tag: str) -> None:
        import docker.errors

        env = task.environment
        bound = log.bind(task_id=task.id, image=tag)
        bound.info("building image", context=str(env.path))
        lines: list[str] = []
        error: str | None = None
        try:
            stream = self.client.api.build(
                path=str(env.path),
                dockerfile=env.dockerfile.name,
                tag=tag,
                rm=True,
                forcerm=True,
                decode=True,
                labels=task_image_labels(task),
            )
            for chunk in stream:
                if "stream" in chunk:
                    for line in chunk["stream"].splitlines():
                        if line.strip():
                            lines.append(line)
                            # Step lines are the progress a person wants to see.
                            if line.startswith("Step "):
                                bound.info("build", step=line)
                            else:
                                bound.debug("build", line=line)
                if "error" in chunk:
                    error = str(chunk["error"]).strip()
                    lines.append(error)
        except docker.errors.APIError as exc:
            error = str(exc)
            lines.append(error)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker daemon error while building {tag}: {exc}") from exc
        build_log = "\n".join(lines)
        if error is not None:
            tail = "\n".join(lines[-30:])
            raise BrokenEnvironment(
                f"task {task.id}: building {env.dockerfile} failed: {error}\n"
                f"--- build log (last lines) ---\n{tail}",
                build_log=build_log,
            )
        bound.info("image built")

    # -- sandboxes -----------------------------------------------------------------------

    async def start(
        self,
        task: Any,
        *,
        trial_id: str,
        labels: Mapping[str, str],
        mounts: Mapping[Path, str] | None = None,
    ) -> DockerSandbox:
        return await self._when_daemon_answers(
            lambda: self._start(task, trial_id=trial_id, labels=labels, mounts=mounts)
        )

    async def _when_daemon_answers(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``; if the daemon did not answer, once more when it answers again.

        A restarting daemon: without this wait every trial started during the outage fails
        at once, and the run burns through its tasks in seconds."""
        try:
            return await attempt()
        except DaemonUnreachable:
            if not await self._daemon_back():
                raise
        return await attempt()

    async def _daemon_back(self) -> bool:
        """Wait up to ``daemon_wait_s`` for the daemon to answer a ping again."""
        import docker.errors

        deadline = time.monotonic() + self.config.daemon_wait_s
        delay = 0.1
        while time.monotonic() < deadline:
            try:
                await self.call(self.client.ping)
                log.info("docker daemon answers again; starting the sandbox")
                return True
            except (SandboxError, docker.errors.DockerException):  # still starting up
                await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 2.0)
        return False

    async def _start(
        self,
        task: Any,
        *,
        trial_id: str,
        labels: Mapping[str, str],
        mounts: Mapping[Path, str] | None,
    ) -> DockerSandbox:
        await self._ensure(task)
        if self.config.socket_dir is None and not daemon_is_local(self.client.api.base_url):
            raise SandboxError(
                f"the docker daemon at {self.client.api.base_url} is not on this machine, so it "
                f"cannot mount this machine's proxy socket into sandboxes. Set the backend's "
                f"socket_dir to a folder the daemon's host shares with this one, or run slr "
                f"on the daemon's host"
            )
        link = ProxyLink(parent=self.config.socket_dir)
        listener: ExecListener | None = None
        try:
            link.start()
            if self.config.exec_server:
                listener = ExecListener(link.dir)
            container = await self.call(
                self._create, task, trial_id, labels, mounts or {}, link, listener is not None
            )
        except BaseException:
            if listener is not None:
                listener.close()
            link.remove()
            raise
        sandbox = DockerSandbox(
            api=self.client.api,
            call=self.call,
            container=container,
            link=link,
            proxy_port=self.config.proxy_port,
        )
        try:
            await self.call(self._start_and_wait_ready, container)
            if listener is not None:
                sandbox.channel = self._exec_channel(listener, container)
        except BaseException:
            if listener is not None:
                listener.close()
            await sandbox.stop()
            raise
        return sandbox

    def _exec_channel(self, listener: ExecListener, container: Any) -> ExecChannel | None:
        """The container's exec server, dialled before its ready line; None (commands go
        through the daemon) when it did not start: an image whose user is not root, or a
        python3 that cannot run it."""
        channel = listener.accept_ready(container.attrs["Config"].get("Env") or [])
        if channel is None:
            log.info(
                "no exec server in the sandbox; its commands go through the daemon",
                container=container.short_id,
            )
        return channel

    def _create(self, task, trial_id, labels, mounts, link, exec_server: bool):
        import docker.errors

        env = task.environment
        volumes = {str(link.dir): {"bind": LINK_MOUNT, "mode": "ro"}}
        for host, inner in mounts.items():
            volumes[str(Path(host).resolve())] = {"bind": inner, "mode": "ro"}
        # The caller's labels (the run's) cannot override what the backend itself sets.
        all_labels = {
            **trial_labels(
                run_id=None,
                trial_id=trial_id,
                task_id=task.id,
                extra={str(k): str(v) for k, v in labels.items()},
            ),
            SANDBOX: "docker",
            OWNER_HOST: socket.gethostname(),
            OWNER_PID: str(os.getpid()),
        }
        try:
            return self.client.containers.create(
                self.image_tag(task),
                entrypoint=[
                    "python3",
                    f"{LINK_MOUNT}/relay.py",
                    str(self.config.proxy_port),
                    f"{LINK_MOUNT}/proxy.sock",
                    *(["--exec", f"{LINK_MOUNT}/{EXEC_SOCKET}"] if exec_server else []),
                ],
                command=[],
                labels=all_labels,
                network_mode="none",
                working_dir=env.workdir,
                environment=dict(env.env),
                nano_cpus=int(env.cpus * 1e9),
                mem_limit=f"{env.memory_mb}m",
                memswap_limit=f"{env.memory_mb}m",
                pids_limit=self.config.pids_limit,
                ulimits=self._ulimits(env),
                volumes=volumes,
                hostname="sandbox",
                detach=True,
            )
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(f"image for task {task.id} vanished: {exc}") from exc
        except docker.errors.DockerException as exc:
            raise SandboxError(f"could not create a container for {task.id}: {exc}") from exc

    def _ulimits(self, env) -> list:
        """Open files, and the size of one file (the task's storage_mb: docker's overlay
        cannot bound the whole disk without xfs quotas, but one runaway file it can)."""
        from docker.types import Ulimit

        nofile, fsize = self.config.open_files, env.storage_mb * 1024 * 1024
        return [
            Ulimit(name="nofile", soft=nofile, hard=nofile),
            Ulimit(name="fsize", soft=fsize, hard=fsize),
        ]

    def _start_and_wait_ready(self, container) -> None:
        import docker.errors

        from slr.sandboxing.relay import READY

        try:
            container.start()
            # Block on the relay's own "ready" line: the first exec may dial the proxy.
            for raw in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                if READY in raw.decode(errors="replace"):
                    return
        except docker.errors.DockerException as exc:
            raise SandboxError(f"container {container.short_id} did not start: {exc}") from exc
        container.reload()
        output = container.logs().decode(errors="replace")[-2000:]
        raise SandboxError(
            f"container {container.short_id} exited ({container.attrs['State'].get('ExitCode')}) "
            f"before its proxy relay was ready; the task image needs python3 on PATH. "
            f"Output: {output}"
        )

    async def cleanup_orphans(self) -> int:
        """Remove what this host's dead slr processes left: containers (by label) and proxy
        link folders (by owner pid). Returns how many."""
        links = remove_stale_links(self.config.socket_dir)
        return links + await self.call(self._cleanup_orphans)

    def _cleanup_orphans(self) -> int:
        import docker.errors

        host = socket.gethostname()
        removed = 0
        for c in self.client.containers.list(all=True, filters={"label": SANDBOX}):
            owner_host = c.labels.get(OWNER_HOST)
            pid = c.labels.get(OWNER_PID, "")
            if owner_host != host or not pid.isdigit() or pid_alive(int(pid)):
                continue  # another machine's or a live process's sandbox
            try:
                c.remove(force=True)
                removed += 1
                log.info("removed orphaned sandbox", container=c.short_id, pid=pid)
            except docker.errors.NotFound:
                pass
        return removed

    def list_sandboxes(self, **labels: str) -> list[Any]:
        """Containers of this backend matching ``labels`` (keys from ``slr.sandboxing.labels``)."""
        filters = [SANDBOX] + [f"{k}={v}" for k, v in labels.items()]
        return self.client.containers.list(all=True, filters={"label": filters})

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()
            self._client = None


def daemon_is_local(base_url: str) -> bool:
    """Whether the SDK's base URL is a daemon on this machine (unix socket or loopback)."""
    host = urlsplit(base_url).hostname or ""
    return base_url.startswith("http+docker://") or host in ("localhost", "127.0.0.1", "::1")
