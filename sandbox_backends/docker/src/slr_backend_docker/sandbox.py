"""One trial's container: exec with process-tree timeouts, tar upload/download, network."""

from __future__ import annotations

import asyncio
import io
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from slr.contracts import ExecResult, NetworkMode, SandboxError
from slr.sandboxing import ProxyLink, command_argv, inner_proxy_url
from slr.sandboxing.cpu import container_cgroup, read_cpu_s
from slr.sandboxing.exec_channel import ChannelLost, ExecChannel
from slr.sandboxing.exec_server import MARKER_KEY as EXEC_MARKER
from slr_backend_docker.client import daemon_unreachable, transport_errors

log = structlog.get_logger()


# Kill every process whose environment carries the exec's marker: the whole tree the
# command started, however it forked or re-parented, without relying on process groups.
_KILL_TREE = (
    "for _ in 1 2 3; do found=; for p in /proc/[0-9]*; do "
    'if grep -qsxz "$0=$1" "$p/environ"; then kill -9 "${p#/proc/}" 2>/dev/null; found=1; fi; '
    'done; [ -z "$found" ] && break; done; true'
)


class DockerSandbox:
    """``Sandbox`` backed by one container. Every daemon failure becomes ``SandboxError``,
    a daemon that stopped answering included (so the trial ends as an infrastructure failure).

    ``api`` is the SDK's low-level client and ``call`` runs a blocking function of it off the
    event loop (the backend's thread pool): all the sandbox needs of its backend.

    ``channel``: the container's exec server (PID 1), which runs the agent phase's commands
    without the daemon's exec API. It is as trustworthy as the agent (an agent with root
    could take PID 1 over), so it is closed for good when the agent phase ends
    (``end_processes``, ``set_network``): whatever decides the reward runs through the daemon.
    """

    def __init__(
        self,
        *,
        api: Any,
        call: Callable[..., Awaitable[Any]],
        container: Any,
        link: ProxyLink,
        proxy_port: int,
        channel: ExecChannel | None = None,
    ) -> None:
        self._api = api
        self.channel = channel
        self._run = call
        self.container = container
        self.id = container.id
        self.link = link
        self.proxy_port = proxy_port
        self.network: NetworkMode = "proxy-only"
        self._stopped = False
        self._cgroup: Path | bool | None = False  # False: not looked up yet

    def cpu_s(self) -> float | None:
        """CPU seconds of the container's cgroup (every process in it, execs included);
        None when its cgroup is not on this machine (a remote daemon)."""
        if self._cgroup is False:
            self._cgroup = container_cgroup(self.id)
        return None if not isinstance(self._cgroup, Path) else read_cpu_s(self._cgroup)

    async def healthy(self) -> bool:
        """Whether the container still runs with its relay (PID 1) and its proxy link."""
        if self._stopped or not self.link.alive:
            return False
        try:
            state = (await self._call(self._api.inspect_container, self.id))["State"]
        except SandboxError:
            return False
        return bool(state.get("Running"))

    async def _call(self, fn, *args, **kwargs):
        import docker.errors

        try:
            return await self._run(fn, *args, **kwargs)
        except docker.errors.NotFound as exc:
            raise SandboxError(f"sandbox {self.id[:12]} is gone: {exc}") from exc
        except docker.errors.DockerException as exc:
            raise SandboxError(f"sandbox {self.id[:12]}: docker error: {exc}") from exc
        except transport_errors() as exc:
            # The daemon went away (stopped, restarted, its socket closed mid-stream): the
            # SDK lets the transport's error through, which the trial would otherwise take
            # for the agent's own failure and score.
            raise daemon_unreachable(self._api.base_url, fn, exc) from exc
        except ValueError as exc:
            # docker-py's stream reader raises a bare ValueError ("58 is not a valid stream")
            # when the daemon's multiplexed output is not what it expects: a broken
            # connection, not a bad argument of ours.
            raise SandboxError(
                f"sandbox {self.id[:12]}: the docker SDK could not read the daemon's answer "
                f"to {getattr(fn, '__name__', fn)!s}: {exc}"
            ) from exc

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
        marker = uuid.uuid4().hex
        started = time.monotonic()
        if self.channel is not None and not self.channel.closed:
            try:
                out = await self.channel.run(
                    argv, marker=marker, timeout_s=timeout_s, user=user, cwd=cwd, env=env
                )
            except ChannelLost as exc:
                # PID 1 is the exec server: its end is the container's (or a broken sandbox)
                await self._check_alive()
                raise SandboxError(f"sandbox {self.id[:12]}: {exc}") from exc
            # no aliveness check for 126 / >= 128 here: PID 1 answered, so the container lives
            return ExecResult(
                exit_code=out.exit_code,
                stdout=out.stdout.decode(errors="replace"),
                stderr=out.stderr.decode(errors="replace"),
                timed_out=out.timed_out,
                duration_s=time.monotonic() - started,
            )
        return await self._exec_via_daemon(argv, marker, started, timeout_s, user, cwd, env)

    async def _exec_via_daemon(
        self,
        argv: list[str],
        marker: str,
        started: float,
        timeout_s: float | None,
        user: str | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
    ) -> ExecResult:
        environment = {**(env or {}), EXEC_MARKER: marker}
        exec_id = (
            await self._call(
                self._api.exec_create,
                self.id,
                argv,
                stdout=True,
                stderr=True,
                user=user or "",
                workdir=cwd,
                environment=environment,
            )
        )["Id"]
        run = asyncio.ensure_future(self._call(self._api.exec_start, exec_id, demux=True))
        timed_out = False
        try:
            out, err = await asyncio.wait_for(asyncio.shield(run), timeout=timeout_s)
        except TimeoutError:
            timed_out = True
            await self._kill_tree(marker)
            # The kill ends the stream; whatever the command printed so far comes back.
            try:
                out, err = await asyncio.wait_for(run, timeout=30)
            except TimeoutError:
                raise SandboxError(
                    f"sandbox {self.id[:12]}: a command ran past {timeout_s:g}s and could not "
                    f"be killed"
                ) from None
        except asyncio.CancelledError:
            await asyncio.shield(self._kill_tree(marker))
            raise
        info = await self._call(self._api.exec_inspect, exec_id)
        # The daemon records the exit code from an event that can trail the stream's end.
        deadline = time.monotonic() + 5
        while info.get("Running") and info.get("ExitCode") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            info = await self._call(self._api.exec_inspect, exec_id)
        code = info.get("ExitCode")
        # 126: the runtime could not exec (container stopping or gone); >= 128: a signal,
        # perhaps the container's own death. Either way, ask whether the sandbox lives.
        if code is None or code >= 126:
            await self._check_alive()
        return ExecResult(
            exit_code=137 if code is None else code,
            stdout=(out or b"").decode(errors="replace"),
            stderr=(err or b"").decode(errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    async def _kill_tree(self, marker: str) -> None:
        try:
            exec_id = (
                await self._call(
                    self._api.exec_create,
                    self.id,
                    ["sh", "-c", _KILL_TREE, EXEC_MARKER, marker],
                    user="root",
                )
            )["Id"]
            await self._call(self._api.exec_start, exec_id)
        except SandboxError as exc:
            log.warning("could not kill a timed-out command", sandbox=self.id[:12], error=str(exc))

    async def _check_alive(self) -> None:
        state = (await self._call(self._api.inspect_container, self.id))["State"]
        if not state.get("Running"):
            reason = "out of memory" if state.get("OOMKilled") else f"exit {state.get('ExitCode')}"
            raise SandboxError(f"sandbox {self.id[:12]} stopped during a command ({reason})")
        # The daemon marks a killed container as exited a moment after its processes die;
        # a fresh exec tells for sure (it cannot enter a dead container's namespaces).
        try:
            probe = (await self._call(self._api.exec_create, self.id, ["true"]))["Id"]
            await self._call(self._api.exec_start, probe)
            code = (await self._call(self._api.exec_inspect, probe)).get("ExitCode")
        except SandboxError as exc:
            raise SandboxError(f"sandbox {self.id[:12]} stopped during a command: {exc}") from exc
        if code != 0:
            raise SandboxError(f"sandbox {self.id[:12]} stopped during a command (probe {code})")

    def close_channel(self) -> None:
        """From now on every command goes through the daemon (the agent phase is over)."""
        if self.channel is not None:
            self.channel.close()

    async def end_processes(self) -> None:
        """Kill everything but the relay (PID 1): nothing the agent started survives."""
        self.close_channel()
        res = await self.exec(["sh", "-c", "kill -9 -1 2>/dev/null; true"], user="root", cwd="/")
        if not res.ok:
            raise SandboxError(f"could not end the sandbox's processes: {res.stderr.strip()}")

    # -- files ---------------------------------------------------------------------------

    async def upload(self, src: Path, dest: str) -> None:
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"upload source {src} does not exist")
        target = PurePosixPath("/", dest)
        if target == PurePosixPath("/"):
            raise ValueError("cannot upload onto / itself")
        # Rooted at "/": the engine creates missing parent folders, so no mkdir exec is needed.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(src, arcname=str(target.relative_to("/")), filter=_as_root)
        ok = await self._call(self._api.put_archive, self.id, "/", buf.getvalue())
        if not ok:
            raise SandboxError(f"upload of {src} to {dest} was refused by the daemon")

    async def download(self, src: str, dest: Path) -> None:
        dest = Path(dest)

        def fetch() -> bytes:
            import docker.errors

            try:
                stream, _ = self._api.get_archive(self.id, src)
            except docker.errors.NotFound:
                raise FileNotFoundError(f"{src} does not exist in sandbox {self.id[:12]}") from None
            return b"".join(stream)

        data = await self._call(fetch)
        name = PurePosixPath(src).name or "root"
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(tmp, filter="data")
            got = Path(tmp) / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_dir() and got.is_dir():
                shutil.copytree(got, dest, dirs_exist_ok=True, symlinks=True)
            else:
                shutil.move(str(got), dest)

    # -- network -------------------------------------------------------------------------

    def proxy_url(self, host_url: str) -> str:
        inner, target = inner_proxy_url(host_url, self.proxy_port)
        self.link.set_target(*target)
        return inner

    async def set_network(self, mode: NetworkMode) -> None:
        if mode == self.network:
            return
        if mode == "proxy-only":
            raise SandboxError("a sandbox cannot go back to proxy-only after the agent phase")
        self.close_channel()
        self.link.close()
        if mode == "full":
            await self._call(self._api.disconnect_container_from_network, self.id, "none")
            await self._call(self._api.connect_container_to_network, self.id, "bridge")
        self.network = mode

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.close_channel()
        import docker.errors

        def remove() -> None:
            try:
                self._api.remove_container(self.id, force=True, v=True)
            except docker.errors.NotFound:
                pass

        try:
            await self._run(remove)
        finally:
            self.link.remove()


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
