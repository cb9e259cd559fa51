"""One trial's pod: exec with timeouts, tar upload / download over exec, network, logs."""

from __future__ import annotations

import asyncio
import functools
import io
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import structlog
from attrs import frozen

from slr.contracts import ExecResult, NetworkMode, SandboxError
from slr.sandboxing import ProxyLink, command_argv, inner_proxy_url
from slr_backend_k8s import execstream
from slr_backend_k8s.api import K8sError, KubeApi, PodGone, explain, is_not_found
from slr_backend_k8s.config import K8sBackendConfig
from slr_backend_k8s.forward import Forwarder
from slr_backend_k8s.podspec import CONTAINER, IDLE_TAG, RELAY_TAG, network_policy

log = structlog.get_logger()

MISSING_EXIT = 44  # download: the source path does not exist


@frozen(kw_only=True)
class PodAccess:
    """What a pod's sandbox needs of its backend, handed to it at start."""

    api: KubeApi  # connected
    config: K8sBackendConfig
    #: Run a blocking function on the backend's threads (every exec holds one).
    call: Callable[..., Awaitable[Any]]
    #: A pod's name -> '' while it runs; otherwise what happened to it, in words.
    pod_problem: Callable[[str], str]
    #: Delete a pod (and its policy) by name and free its slot.
    release: Callable[[str], Awaitable[None]]
    #: Whether each pod has a NetworkPolicy to change with the network mode.
    uses_policy: bool


class K8sSandbox:
    """``Sandbox`` backed by one pod. Every API failure becomes a ``SandboxError``."""

    def __init__(
        self,
        *,
        access: PodAccess,
        name: str,
        labels: dict[str, str],
        pod_ip: str,
        node: str,
        proxy_host: str | None,
        link: ProxyLink | None = None,
        open_files: int | None = None,
        file_size_mb: int | None = None,
    ) -> None:
        self._access = access
        self._api = access.api
        self.id = name
        self.name = name
        self.namespace = access.config.namespace
        self.labels = labels
        self.pod_ip = pod_ip
        self.node = node
        self.proxy_host = proxy_host
        self.network: NetworkMode = "proxy-only"
        self.forwarder: Forwarder | None = None
        self.link = link
        # every command's rlimits (the pod spec has no such field): see execstream.WRAPPER
        self.open_files = open_files
        self.file_size_mb = file_size_mb
        self._stopped = False
        self._lock = threading.Lock()

    # -- exec ----------------------------------------------------------------------------

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        argv = command_argv(command)
        if not argv:
            raise ValueError("exec needs a command")
        return await self._exec(argv, timeout_s=timeout_s, user=user, cwd=cwd, env=env)

    async def _exec(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._check_not_stopped()
        marker = uuid.uuid4().hex
        wrapped = execstream.wrap(
            argv,
            marker=marker,
            cwd=cwd,
            user=user,
            env=env,
            open_files=self.open_files,
            file_size_mb=self.file_size_mb,
        )
        started = time.monotonic()
        deadline = started + timeout_s if timeout_s is not None else None
        cancel = threading.Event()
        job = functools.partial(
            execstream.run,
            self._api,
            self.namespace,
            self.name,
            CONTAINER,
            wrapped,
            stdin=stdin,
            deadline=deadline,
            cancel=cancel,
            on_timeout=functools.partial(self._kill_tree, marker),
        )
        running = asyncio.ensure_future(self._access.call(job))
        try:
            res = await asyncio.shield(running)
        except asyncio.CancelledError:
            # The worker thread sees the flag, kills the command's tree and ends the stream.
            cancel.set()
            raise
        except K8sError:
            await self._raise_if_gone()
            raise
        if res.exit_code is None:
            await self._raise_if_gone()
            if res.failure:
                raise K8sError(
                    f"exec in pod {self.name} failed: {res.failure}. The task image needs "
                    f"/bin/sh (and bash for string commands)"
                )
            if not res.timed_out:
                raise K8sError(
                    f"exec in pod {self.name} ended without an exit status "
                    f"({res.stderr.decode(errors='replace')[-300:].strip()})"
                )
        elif res.exit_code >= 128 and not res.timed_out:
            await self._raise_if_gone()  # a kill may have been the pod dying
        return ExecResult(
            exit_code=res.exit_code if res.exit_code is not None else 137,
            stdout=res.stdout.decode(errors="replace"),
            stderr=res.stderr.decode(errors="replace"),
            timed_out=res.timed_out,
            duration_s=time.monotonic() - started,
        )

    def _kill_tree(self, marker: str) -> None:
        """Kill every process of one exec (runs on the exec's worker thread)."""
        try:
            res = execstream.run(
                self._api,
                self.namespace,
                self.name,
                CONTAINER,
                ["sh", "-c", execstream.KILL_TREE, "slr-kill", marker],
                deadline=time.monotonic() + 30,
            )
            if res.exit_code != 0:
                log.warning("killing a timed-out command failed", pod=self.name, result=res)
        except SandboxError as exc:
            log.warning("could not kill a timed-out command", pod=self.name, error=str(exc))

    async def end_processes(self) -> None:
        """Kill everything but the pod's own idle processes: nothing the agent started survives."""
        keep = RELAY_TAG if self.link is not None else IDLE_TAG
        res = await self._exec(["sh", "-c", execstream.END_PROCESSES, "slr-end", keep], cwd="/")
        if not res.ok:
            raise SandboxError(f"could not end the processes in pod {self.name}: {res.stderr}")

    # -- files ---------------------------------------------------------------------------

    async def upload(self, src: Path, dest: str) -> None:
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"upload source {src} does not exist")
        target = PurePosixPath(dest)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(src, arcname=target.name, filter=_as_root)
        data = buf.getvalue()
        # head -c ends the input: the exec channel protocol of older servers cannot close stdin.
        res = await self._exec(
            [
                "sh",
                "-c",
                'mkdir -p "$1" && head -c "$2" | tar -x -f - -C "$1"',
                "slr-upload",
                str(target.parent),
                str(len(data)),
            ],
            stdin=data,
            cwd="/",
        )
        if not res.ok:
            raise SandboxError(
                f"upload of {src} to {dest} in pod {self.name} failed (exit {res.exit_code}): "
                f"{res.stderr.strip()[-500:]}"
            )

    async def download(self, src: str, dest: Path) -> None:
        dest = Path(dest)
        path = PurePosixPath(src)
        res = await self._exec_bytes(
            [
                "sh",
                "-c",
                f'[ -e "$1" ] || exit {MISSING_EXIT}; cd "$(dirname "$1")" && '
                'tar -c -f - "$(basename "$1")"',
                "slr-download",
                str(path),
            ]
        )
        if res.exit_code == MISSING_EXIT:
            raise FileNotFoundError(f"{src} does not exist in pod {self.name}")
        if res.exit_code != 0:
            raise SandboxError(
                f"download of {src} from pod {self.name} failed (exit {res.exit_code}): "
                f"{res.stderr.decode(errors='replace').strip()[-500:]}"
            )
        name = path.name or "root"
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
                tar.extractall(tmp, filter="data")
            got = Path(tmp) / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_dir() and got.is_dir():
                shutil.copytree(got, dest, dirs_exist_ok=True, symlinks=True)
            else:
                shutil.move(str(got), dest)

    async def _exec_bytes(self, argv: list[str]) -> execstream.StreamResult:
        """An exec whose stdout stays bytes (tar); raises like ``exec`` on a dead pod."""
        self._check_not_stopped()
        job = functools.partial(
            execstream.run,
            self._api,
            self.namespace,
            self.name,
            CONTAINER,
            execstream.wrap(argv, marker=uuid.uuid4().hex, cwd="/"),
        )
        try:
            res = await self._access.call(job)
        except K8sError:
            await self._raise_if_gone()
            raise
        if res.exit_code is None:
            await self._raise_if_gone()
            raise K8sError(f"exec in pod {self.name} ended without an exit status: {res.failure}")
        return res

    async def logs(self) -> str:
        """The pod's own output (its PID 1 prints nothing unless the image's command did)."""
        return await self._access.call(
            self._api.core.read_namespaced_pod_log, self.name, self.namespace, container=CONTAINER
        )

    # -- network -------------------------------------------------------------------------

    def proxy_url(self, host_url: str) -> str:
        """``host_url`` as the pod reaches it: relayed on its loopback, forwarded, or rewritten."""
        if self.link is not None:
            with self._lock:
                if self.network != "proxy-only":
                    raise SandboxError("the proxy link is closed after the agent phase")
                inner, target = inner_proxy_url(host_url, self._access.config.link_port)
                self.link.set_target(*target)
            return inner
        parts = urlsplit(host_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"proxy URL {host_url!r} is not an http(s) URL with a host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        cfg = self._access.config
        if self.proxy_host is None:
            raise SandboxError(f"pod {self.name} has no address to reach the proxy at")
        if cfg.proxy_forward:
            with self._lock:
                if self.network != "proxy-only":
                    raise SandboxError("the proxy link is closed after the agent phase")
                if self.forwarder is None:
                    self.forwarder = Forwarder(self.proxy_host, allowed_peer=self.pod_ip)
                self.forwarder.target = (parts.hostname, port)
            host, inner_port = self.proxy_host, self.forwarder.port
        else:
            host, inner_port = self.proxy_host, cfg.proxy_port or port
        netloc = f"[{host}]:{inner_port}" if ":" in host else f"{host}:{inner_port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))

    async def set_network(self, mode: NetworkMode) -> None:
        if mode == self.network:
            return
        if mode == "proxy-only":
            raise SandboxError("a sandbox cannot go back to proxy-only after the agent phase")
        with self._lock:
            self.network = mode
            if self.forwarder is not None:
                self.forwarder.close()
            if self.link is not None:
                self.link.close()
        if self.link is not None and mode == "full":
            # The init container deleted the pod's interfaces; they cannot come back.
            log.warning(
                "network = 'loopback' cannot give the verifier phase network access; it runs "
                "without network (use backend.network = 'policy' for tasks that need it)",
                pod=self.name,
            )
        if self._access.uses_policy:
            await self._access.call(self._replace_policy, mode)

    def _replace_policy(self, mode: NetworkMode) -> None:
        net = self._api.networking
        try:
            if mode == "full":
                net.delete_namespaced_network_policy(self.name, self.namespace)
            else:
                body = network_policy(
                    name=self.name, labels=self.labels, proxy_ip=None, proxy_port=None
                )
                net.replace_namespaced_network_policy(self.name, self.namespace, body)
        except Exception as exc:
            if not is_not_found(exc):
                raise explain(
                    exc,
                    f"changing the network policy of pod {self.name} to {mode}",
                    api=self._api,
                    namespace=self.namespace,
                ) from exc

    # -- life ----------------------------------------------------------------------------

    def _check_not_stopped(self) -> None:
        if self._stopped:
            raise SandboxError(f"sandbox {self.name} was stopped")

    async def _raise_if_gone(self) -> None:
        problem = await self._access.call(self._access.pod_problem, self.name)
        if problem:
            raise PodGone(f"pod {self.name} {problem}; the trial's sandbox is lost")

    async def stop(self) -> None:
        """Delete the pod at once (grace 0) and its policy; never raises for a gone pod."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            if self.forwarder is not None:
                self.forwarder.close()
        try:
            await self._access.release(self.name)
        finally:
            if self.link is not None:
                self.link.remove()


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
