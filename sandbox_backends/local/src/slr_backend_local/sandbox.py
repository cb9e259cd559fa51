"""One local trial: a workspace folder, and commands run in it under bubblewrap.

Ending a command (a timeout, a cancelled trial, ``end_processes``) must end all of it, or
whatever still holds its output pipes keeps the exec waiting for an end of file that never
comes. Under bubblewrap that is harder than killing a process tree: bwrap clones the
sandbox's init (pid 1 of its namespaces, where the command runs) and that init asks for
``--die-with-parent``'s SIGKILL only once its set-up is done. If bwrap dies in between,
the init is re-parented to the host's init, finishes its set-up, starts the command and
outlives everything, holding the pipes. So each command carries a marker on bwrap's command
line (which the init, a fork of bwrap, shares); ending it kills bwrap's tree, waits until
bwrap has really exited (after that it cannot clone anything more) and then kills whatever
still carries the marker: killing the init takes its whole pid namespace along.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import shutil
import signal
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from slr.contracts import ExecResult, NetworkMode, SandboxError
from slr.sandboxing import ProxyLink, command_argv, inner_proxy_url
from slr.sandboxing.cpu import SandboxCgroup
from slr_backend_local.isolation import BASE_ENV, HOST_USR_MOUNT, LINK_MOUNT, bwrap_argv
from slr_backend_local.limits import SandboxLimits
from slr_backend_local.rootfs import remove_tree

log = structlog.get_logger()

_warned_user = False

# The variable that marks each command (the docker backend uses the same name); under
# bubblewrap it is on bwrap's command line, ``--setenv SLR_EXEC_ID <marker>``.
EXEC_MARKER = "SLR_EXEC_ID"
# How long an ended command's output may still take to reach its end of file. Under
# bubblewrap nothing is left to hold the pipes; without it, a process that escaped into its
# own session can keep them open, and its output is given up on.
_DRAIN_S = 10.0


class _Command:
    """One running command: its process, its marker, and a pidfd that says when it exited."""

    def __init__(self, proc: asyncio.subprocess.Process, marker: str) -> None:
        self.proc = proc
        self.marker = marker
        self.ended = False  # killed on purpose (a timeout, a cancel, end_processes, stop)
        try:
            # Opened while the process cannot have been reaped yet (the exec has not waited).
            self.pidfd: int | None = os.pidfd_open(proc.pid)
        except (OSError, AttributeError):  # already gone, or no pidfd (Linux < 5.3)
            self.pidfd = None

    async def exited(self) -> None:
        """Return once the process has exited (reaped or not), without reading its pipes."""
        if self.pidfd is None:
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def readable() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(self.pidfd, readable)
        try:
            await done
        finally:
            loop.remove_reader(self.pidfd)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class LocalSandbox:
    """``Sandbox`` in a workspace folder. ``workspace/fs`` is the sandbox's ``/``.

    ``bwrap`` is the bubblewrap binary (None: no isolation, plain subprocesses); ``python``
    runs the proxy relay in front of each command, which listens on ``proxy_port``.
    """

    def __init__(
        self,
        *,
        bwrap: str | None,
        python: str | Sequence[str],
        proxy_port: int,
        workspace: Path,
        workdir: str,
        env: Mapping[str, str],
        link: ProxyLink | None,
        mounts: Mapping[Path, str],
        cgroup: SandboxCgroup | None = None,
        limits: SandboxLimits | None = None,
        start_cpu_s: float = 0.0,
        host_usr: bool = True,
    ) -> None:
        self.bwrap = bwrap
        self.host_usr = host_usr
        # the relay's interpreter: a path in the sandbox, or a command line (the host's
        # python through its loader, from HOST_USR_MOUNT, for an image without python3)
        self.python = [python] if isinstance(python, str) else list(python)
        self.proxy_port = proxy_port
        self.workspace = workspace
        self.root = workspace / "fs"
        self.id = workspace.name
        self.workdir = workdir
        self.env = dict(env)
        self.link = link
        self.mounts = mounts
        self.cgroup = cgroup
        self.limits = limits
        self.start_cpu_s = start_cpu_s
        self.network: NetworkMode = "proxy-only"
        self._procs: set[_Command] = set()
        self._stopped = False

    def host_path(self, inner: str) -> Path:
        """Where an absolute path inside the sandbox lies on the host."""
        norm = posixpath.normpath("/" + inner)
        return self.root / norm.lstrip("/")

    def cpu_s(self) -> float | None:
        """The host CPU spent making this sandbox plus its cgroup's (every command it ran);
        None without a writable cgroup hierarchy (``slr.sandboxing.cpu``)."""
        used = self.cgroup.cpu_s() if self.cgroup is not None else None
        return None if used is None else self.start_cpu_s + used

    async def healthy(self) -> bool:
        """Whether it can still run a command: not stopped, its workspace and link intact."""
        if self._stopped or not self.root.is_dir():
            return False
        return self.link is None or self.link.alive

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
        oom_before = 0
        if user not in (None, "root", "0") and not _warned_user:
            _warned_user = True
            log.warning("local backend runs every command as the invoking user", asked=user)
        argv = command_argv(command)
        inner_cwd = cwd or self.workdir
        full_env = {**self.env, **(env or {})}
        marker = uuid.uuid4().hex
        full_env[EXEC_MARKER] = marker
        if self.bwrap is not None:
            relay = self.link is not None and self.network == "proxy-only"
            if relay:
                argv = [
                    *self.python,
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
                mounts=self._mounts(relay),
                host_usr=self.host_usr,
            )
            if self.limits is not None:
                argv = self.limits.wrap(argv)
                oom_before = self.limits.oom_kills()
            proc_env = dict(BASE_ENV)
            host_cwd = None
        else:
            proc_env = {**os.environ, **full_env}
            host_cwd = self.host_path(inner_cwd)
        if self.cgroup is not None:
            argv = self.cgroup.wrap(argv)
        started = time.monotonic()
        cmd = await self._spawn(argv, marker, env=proc_env, cwd=host_cwd)
        self._procs.add(cmd)
        timed_out = False
        try:
            comm = asyncio.ensure_future(cmd.proc.communicate())
            try:
                out, err = await asyncio.wait_for(asyncio.shield(comm), timeout=timeout_s)
            except TimeoutError:
                timed_out = True
                await self._end(cmd)
                out, err = await _drained(comm)
            except asyncio.CancelledError:
                # End it here, pipes included: a command left running would hold them.
                await self._end(cmd)
                await _drained(comm)
                raise
        finally:
            self._procs.discard(cmd)
            cmd.close()
        proc = cmd.proc
        self._check()
        code = proc.returncode
        if self.bwrap is not None and not cmd.ended and code is not None and code < 0:
            # bwrap reports what happened inside as an exit status; bwrap itself dying by a
            # signal nobody here sent is the sandbox killed from outside (nothing inside can
            # reach it): an infrastructure failure, not the command's (nor the policy's)
            raise SandboxError(
                f"sandbox {self.id}: its bubblewrap process was killed by signal {-code} "
                f"from outside the sandbox"
            )
        stderr = err.decode(errors="replace")
        if self.limits is not None:
            stderr += self.limits.oom_message(oom_before)
        return ExecResult(
            # A signal shows as 128 + its number, as in a shell (asyncio gives -signum).
            exit_code=137 if code is None else (128 - code if code < 0 else code),
            stdout=out.decode(errors="replace"),
            stderr=stderr,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    def _mounts(self, relay: bool) -> Mapping[Path, str]:
        if relay and self.python[0].startswith(HOST_USR_MOUNT + "/"):
            return {**self.mounts, Path("/usr"): HOST_USR_MOUNT}
        return self.mounts

    async def end_processes(self) -> None:
        """Kill what is still running. Under bubblewrap each command has its own pid
        namespace, so nothing outlives its command; this ends the commands themselves."""
        await asyncio.gather(*(self._end(cmd) for cmd in list(self._procs)))

    async def _spawn(
        self, argv: list[str], marker: str, *, env: dict[str, str], cwd: Path | None
    ) -> _Command:
        # Shielded: a cancel that lands while asyncio is still connecting the pipes would be
        # handled by asyncio itself, which kills bwrap alone (its sandbox's init can escape,
        # see the module's docstring) and then waits for pipes it never connected: forever.
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group: the kill takes the group
            )
        )
        try:
            proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                cmd = _Command(await spawn, marker)
                try:
                    await self._end(cmd)
                    await _drained(asyncio.ensure_future(cmd.proc.communicate()))
                finally:
                    cmd.close()
            raise
        except OSError as exc:
            raise SandboxError(f"sandbox {self.id}: cannot start {argv[0]}: {exc}") from exc
        return _Command(proc, marker)

    async def _end(self, cmd: _Command) -> None:
        """Kill a command and everything it started, bubblewrap's escaped init included."""
        cmd.ended = True
        if cmd.proc.returncode is None:  # once reaped, its pid may be another process's
            _kill_tree(cmd.proc.pid)
        await cmd.exited()
        if self.bwrap is not None:
            kill_marked_processes(cmd.marker)

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
        if (
            self.bwrap is not None
            and self.host_usr
            and top in ("usr", "bin", "sbin", "lib", "lib64")
        ):
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
        for cmd in list(self._procs):
            cmd.ended = True
            _kill_tree(cmd.proc.pid)
        # A safety net: anything still running on this workspace (a sandbox whose bwrap
        # parent died without taking it along) is found by its root and killed.
        kill_workspace_processes(self.root)
        if self.link is not None:
            self.link.remove()
        await asyncio.to_thread(remove_tree, self.workspace)
        if self.limits is not None:
            self.limits.remove()
        if self.cgroup is not None:
            self.cgroup.remove()  # a miss (a process still exiting) goes at the next start


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first (read from /proc)."""
    pids = [pid]
    for parent in pids:
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                pids.extend(int(c) for c in children.read_text().split())
    return pids


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its descendants and its process group (the command's session)."""
    for p in reversed(_tree(pid)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _drained(comm: asyncio.Future[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """A killed command's output, once its pipes reach their end of file."""
    try:
        return await asyncio.wait_for(asyncio.shield(comm), timeout=_DRAIN_S)
    except TimeoutError:  # without bubblewrap, an escaped child may hold the pipes
        comm.cancel()
        return b"", b"(output lost: a process outlived the kill)"


def _kill_matching(needle: bytes) -> int:
    """SIGKILL every process on this machine whose NUL-separated command line holds
    ``needle``; returns how many."""
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


def kill_marked_processes(marker: str) -> int:
    """SIGKILL every bubblewrap process of the command marked ``marker``."""
    return _kill_matching(f"\0--setenv\0{EXEC_MARKER}\0{marker}\0".encode())


def kill_workspace_processes(root: Path) -> int:
    """SIGKILL every process on this machine whose command line binds ``root`` as ``/``."""
    return _kill_matching(f"\0--bind\0{root}\0/\0".encode())
