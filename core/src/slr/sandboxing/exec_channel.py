"""The host end of a sandbox's exec server (``exec_server.py``): commands as frames on one
socket instead of the daemon's exec API.

``ExecListener`` listens in the link folder before the sandbox starts; the sandbox's PID 1
dials it before it says it is ready, so right after the ready line ``accept_ready`` either
takes that one connection (and removes the listener: nothing started later in the sandbox
can dial it) or finds none, and the backend runs its commands through the daemon instead.

``ExecChannel`` multiplexes a sandbox's commands over that connection. A thread reads the
frames and completes each command's future on the event loop that asked, so a sandbox may
be driven from several loops (tests) and no loop blocks on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import structlog

from slr.sandboxing import exec_server as proto

log = structlog.get_logger()

SOCKET_NAME = "exec.sock"
KILL_WAIT_S = 30.0  # a killed command's EXIT comes at once; past this the sandbox is stuck


class ChannelLost(Exception):
    """The exec server stopped answering (its PID 1, and so its sandbox, ended or broke)."""


@attrs.frozen
class ExecTrace:
    """Where one command's time went (``time.monotonic``, which the host and its containers
    share): the host sent its frame, the server read it, the command had started, it exited,
    the server sent the result, the host's reader read it."""

    sent: float
    server_read: float
    started: float
    exited: float
    server_sent: float
    read: float


@attrs.define
class ExecOutput:
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    trace: ExecTrace | None = None


class ExecListener:
    """A listening unix socket in ``folder`` for the sandbox's exec server to dial once."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / SOCKET_NAME
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        # PID 1 runs as the image's user, which may not be ours; once accepted it is gone.
        self.path.chmod(0o777)
        self._sock.listen(1)

    def accept_ready(self, env: Sequence[str]) -> ExecChannel | None:
        """The server's connection if it dialled (call after the sandbox's ready line),
        told the container's configured environment; None if it did not. Closes the
        listener either way."""
        try:
            self._sock.setblocking(False)
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return None
            conn.setblocking(True)
            channel = ExecChannel(conn)
            channel.hello(env)
            return channel
        finally:
            self.close()

    def close(self) -> None:
        self._sock.close()
        self.path.unlink(missing_ok=True)


@attrs.define
class _Pending:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    stdout: bytearray = attrs.field(factory=bytearray)
    stderr: bytearray = attrs.field(factory=bytearray)
    sent: float = 0.0
    trace: ExecTrace | None = None


class ExecChannel:
    """Run commands through one sandbox's exec server (see the module docstring)."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self.closed = False
        self._reader = threading.Thread(target=self._read, name="slr-exec-channel", daemon=True)
        self._reader.start()

    def hello(self, env: Sequence[str]) -> None:
        self._send(proto.HELLO, 0, json.dumps({"env": list(env)}).encode())

    async def run(
        self,
        argv: Sequence[str],
        *,
        marker: str,
        timeout_s: float | None = None,
        user: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecOutput:
        """Run ``argv``; on timeout its process tree is killed and what it printed so far
        comes back with ``timed_out``; a cancelled call kills it too. ``ChannelLost`` if the
        server went away."""
        loop = asyncio.get_running_loop()
        exec_id = next(self._ids)
        pending = _Pending(loop=loop, future=loop.create_future())
        with self._lock:
            if self.closed:
                raise ChannelLost("the exec channel is closed")
            self._pending[exec_id] = pending
        request = {"argv": list(argv), "user": user, "cwd": cwd, "env": dict(env or {})}
        request["marker"] = marker
        pending.sent = time.monotonic()
        try:
            self._send(proto.RUN, exec_id, json.dumps(request).encode())
            timed_out = False
            try:
                code = await asyncio.wait_for(asyncio.shield(pending.future), timeout_s)
            except TimeoutError:
                timed_out = True
                self._send(proto.KILL, exec_id)
                try:
                    code = await asyncio.wait_for(pending.future, KILL_WAIT_S)
                except TimeoutError:
                    raise ChannelLost(
                        f"a command ran past {timeout_s:g}s and could not be killed"
                    ) from None
            except asyncio.CancelledError:
                with contextlib.suppress(ChannelLost):
                    self._send(proto.KILL, exec_id)
                raise
        finally:
            with self._lock:
                self._pending.pop(exec_id, None)
        return ExecOutput(
            exit_code=code,
            stdout=bytes(pending.stdout),
            stderr=bytes(pending.stderr),
            timed_out=timed_out,
            trace=pending.trace,
        )

    def _send(self, kind: int, exec_id: int, payload: bytes = b"") -> None:
        try:
            proto.send_frame(self._conn, self._send_lock, kind, exec_id, payload)
        except OSError as exc:
            self.close()
            raise ChannelLost(f"the exec server is gone ({exc})") from exc

    def _read(self) -> None:
        reason = "the exec server closed its end"
        try:
            while True:
                frame = proto.recv_frame(self._conn)
                if frame is None:
                    break
                kind, exec_id, payload = frame
                with self._lock:
                    pending = self._pending.get(exec_id)
                if pending is None:
                    continue  # a cancelled command's late output
                if kind == proto.STDOUT:
                    pending.stdout += payload
                elif kind == proto.STDERR:
                    pending.stderr += payload
                elif kind == proto.EXIT:
                    read = time.monotonic()
                    body = json.loads(payload)
                    code = int(body["code"])
                    pending.trace = _trace(pending.sent, body.get("t"), read)
                    pending.loop.call_soon_threadsafe(_settle, pending.future, code, None)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            reason = f"the exec channel broke: {type(exc).__name__}: {exc}"
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            self.closed = True
            pending, self._pending = list(self._pending.values()), {}
        for p in pending:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                p.loop.call_soon_threadsafe(_settle, p.future, None, ChannelLost(reason))

    def close(self) -> None:
        """Stop using the server (idempotent); commands still running fail ``ChannelLost``."""
        with self._lock:
            self.closed = True
        with contextlib.suppress(OSError):
            self._conn.shutdown(socket.SHUT_RDWR)
        self._conn.close()


def _trace(sent: float, server: list[float] | None, read: float) -> ExecTrace | None:
    """The command's ``ExecTrace``; None from a server that sends no timestamps."""
    if not server or len(server) != 4:
        return None
    server_read, started, exited, server_sent = server
    return ExecTrace(
        sent=sent,
        server_read=server_read,
        started=started,
        exited=exited,
        server_sent=server_sent,
        read=read,
    )


def _settle(future: asyncio.Future, code: int | None, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(code)
