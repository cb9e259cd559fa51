"""One local trial: a workspace folder, and commands run in it under bubblewrap."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from slr.contracts import ExecResult, NetworkMode, SandboxError
from slr.sandboxing import ProxyLink, command_argv, inner_proxy_url
from slr_backend_local.isolation import BASE_ENV, LINK_MOUNT, bwrap_argv

log = structlog.get_logger()

_warned_user = False


class LocalSandbox:
    """``Sandbox`` in a workspace folder. ``workspace/fs`` is the sandbox's ``/``.

    ``bwrap`` is the bubblewrap binary (None: no isolation, plain subprocesses); ``python``
    runs the proxy relay in front of each command, which listens on ``proxy_port``.
    """

    def __init__(
        self,
        *,
        bwrap: str | None,
        python: str,
        proxy_port: int,
        workspace: Path,
        workdir: str,
        env: Mapping[str, str],
        link: ProxyLink | None,
        mounts: Mapping[Path, str],
    ) -> None:
        self.bwrap = bwrap
        self.python = python
        self.proxy_port = proxy_port
        self.workspace = workspace
        self.root = workspace / "fs"
        self.id = workspace.name
        self.workdir = workdir
        self.env = dict(env)
        self.link = link
        self.mounts = mounts
        self.network: NetworkMode = "proxy-only"
        self._procs: set[asyncio.subprocess.Process] = set()
        self._stopped = False

    def host_path(self, inner: str) -> Path:
        """Where an absolute path inside the sandbox lies on the host."""
        norm = posixpath.normpath("/" + inner)
        return self.root / norm.lstrip("/")

    def _check(self) -> None:
        if self._stopped:
            raise SandboxError(f"sandbox {self.id} was stopped")
        if not self.root.is_dir():
            raise SandboxError(f"sandbox {self.id}: its workspace {self.root} is gone")

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        global _warned_user
        self._check()
        if user not in (None, "root", "0") and not _warned_user:
            _warned_user = True
            log.warning("local backend runs every command as the invoking user", asked=user)
        argv = command_argv(command)
        inner_cwd = cwd or self.workdir
        full_env = {**self.env, **(env or {})}
        if self.bwrap is not None:
            relay = self.link is not None and self.network == "proxy-only"
            if relay:
                argv = [
                    self.python,
                    f"{LINK_MOUNT}/relay.py",
                    str(self.proxy_port),
                    f"{LINK_MOUNT}/proxy.sock",
                    "--",
                    *argv,
                ]
            argv = bwrap_argv(
                self.bwrap,
                self.root,
                argv,
                cwd=inner_cwd,
                env=full_env,
                network=self.network == "full",
                link_dir=self.link.dir if relay and self.link is not None else None,
                mounts=self.mounts,
            )
            proc_env = dict(BASE_ENV)
            host_cwd = None
        else:
            proc_env = {**os.environ, **full_env}
            host_cwd = self.host_path(inner_cwd)
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=proc_env,
                cwd=host_cwd,
                start_new_session=True,  # its own process group: the timeout kills the tree
            )
        except OSError as exc:
            raise SandboxError(f"sandbox {self.id}: cannot start {argv[0]}: {exc}") from exc
        self._procs.add(proc)
        timed_out = False
        try:
            comm = asyncio.ensure_future(proc.communicate())
            try:
                out, err = await asyncio.wait_for(asyncio.shield(comm), timeout=timeout_s)
            except TimeoutError:
                timed_out = True
                self._kill(proc)
                try:
                    out, err = await asyncio.wait_for(comm, timeout=10)
                except TimeoutError:  # without bubblewrap, an escaped child may hold the pipes
                    out, err = b"", b"(output lost: a process outlived the timeout)"
        except asyncio.CancelledError:
            self._kill(proc)
            raise
        finally:
            self._procs.discard(proc)
        self._check()
        code = proc.returncode
        return ExecResult(
            # A signal shows as 128 + its number, as in a shell (asyncio gives -signum).
            exit_code=137 if code is None else (128 - code if code < 0 else code),
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    async def end_processes(self) -> None:
        """Kill what is still running. Under bubblewrap each command has its own pid
        namespace, so nothing outlives its command; this ends the commands themselves."""
        for proc in list(self._procs):
            self._kill(proc)

    def _kill(self, proc: asyncio.subprocess.Process) -> None:
        # bubblewrap's init inside the sandbox starts its own session (--new-session), so a
        # group kill misses it, its --die-with-parent does not always fire, and it keeps the
        # output pipes open (reading them would wait forever): kill the whole tree by pid.
        for pid in reversed(_tree(proc.pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _kill_group(proc)

    async def upload(self, src: Path, dest: str) -> None:
        self._check()
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"upload source {src} does not exist")
        target = self._writable(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            await asyncio.to_thread(shutil.copytree, src, target, symlinks=True, dirs_exist_ok=True)
        else:
            await asyncio.to_thread(shutil.copy2, src, target)

    async def download(self, src: str, dest: Path) -> None:
        self._check()
        path = self.host_path(src)
        if not (path.exists() or path.is_symlink()):
            raise FileNotFoundError(f"{src} does not exist in sandbox {self.id}")
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            await asyncio.to_thread(shutil.copytree, path, dest, symlinks=True, dirs_exist_ok=True)
        else:
            await asyncio.to_thread(shutil.copy2, path, dest)

    def _writable(self, inner: str) -> Path:
        top = posixpath.normpath("/" + inner).lstrip("/").split("/")[0]
        if self.bwrap is not None and top in ("usr", "bin", "sbin", "lib", "lib64"):
            raise SandboxError(f"{inner} is on the host's read-only /usr in a local sandbox")
        return self.host_path(inner)

    def proxy_url(self, host_url: str) -> str:
        if self.link is None:
            # No isolation: the sandbox shares the host's network and dials the proxy as is.
            return host_url
        inner, target = inner_proxy_url(host_url, self.proxy_port)
        self.link.set_target(*target)
        return inner

    async def set_network(self, mode: NetworkMode) -> None:
        if mode == self.network:
            return
        if mode == "proxy-only":
            raise SandboxError("a sandbox cannot go back to proxy-only after the agent phase")
        if self.link is not None:
            self.link.close()
        self.network = mode

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for proc in list(self._procs):
            _kill_group(proc)
        # A safety net: anything still running on this workspace (a sandbox whose bwrap
        # parent died without taking it along) is found by its root and killed.
        kill_workspace_processes(self.root)
        if self.link is not None:
            self.link.remove()
        await asyncio.to_thread(shutil.rmtree, self.workspace, True)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first (read from /proc)."""
    pids = [pid]
    for parent in pids:
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                pids.extend(int(c) for c in children.read_text().split())
    return pids


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_workspace_processes(root: Path) -> int:
    """SIGKILL every process on this machine whose command line binds ``root`` as ``/``."""
    needle = f"\0--bind\0{root}\0/\0".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = b"\0" + fh.read()
        except OSError:
            continue
        if needle in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed
