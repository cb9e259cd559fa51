"""The host end of a sandbox's exec server (``exec_server.py``): commands as frames on one
socket instead of the daemon's exec API.

``ExecListener`` listens in the link folder before the sandbox starts; the sandbox's PID 1
dials it before it says it is ready, so right after the ready line ``accept_ready`` either
takes that one connection (and removes the listener: nothing started later in the sandbox
can dial it) or finds none, and the backend runs its commands through the daemon instead.

``ExecChannel`` multiplexes a sandbox's commands over that connection, on the event loop of
whoever runs them: the socket is one more reader of that loop, so every sandbox's channel is
served by the loop that awaits its commands, with no thread per sandbox and no hand-over
between threads on the way back (at 128 sandboxes a thread each meant 128 threads waking
and queueing for the GIL, and one more wake-up per result). A sandbox may still be driven
from several loops one after the other (tests run each step in its own ``asyncio.run``):
the channel moves to the loop of the next command once the previous loop is done with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
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
    the server sent the result, the host read it."""

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
    future: asyncio.Future
    sent: float
    stdout: bytearray = attrs.field(factory=bytearray)
    stderr: bytearray = attrs.field(factory=bytearray)
    trace: ExecTrace | None = None


class ExecChannel:
    """Run commands through one sandbox's exec server (see the module docstring)."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._fd = conn.fileno()
        conn.setblocking(False)
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._inbox = bytearray()
        # one read buffer, reused: a fresh large one per read is an mmap and munmap each time
        self._chunk = bytearray(1 << 16)
        self._chunk_view = memoryview(self._chunk)
        self._outbox = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def hello(self, env: Sequence[str]) -> None:
        self._queue(_frame(proto.HELLO, 0, json.dumps({"env": list(env)}).encode()))

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
        if self.closed:
            raise ChannelLost("the exec channel is closed")
        loop = self._attach()
        exec_id = next(self._ids)
        request = {"argv": list(argv), "user": user, "cwd": cwd, "env": dict(env or {})}
        request["marker"] = marker
        pending = _Pending(future=loop.create_future(), sent=time.monotonic())
        self._pending[exec_id] = pending
        try:
            self._queue(_frame(proto.RUN, exec_id, json.dumps(request).encode()))
            timed_out = False
            try:
                code = await asyncio.wait_for(asyncio.shield(pending.future), timeout_s)
            except TimeoutError:
                timed_out = True
                self._queue(_frame(proto.KILL, exec_id))
                try:
                    code = await asyncio.wait_for(pending.future, KILL_WAIT_S)
                except TimeoutError:
                    raise ChannelLost(
                        f"a command ran past {timeout_s:g}s and could not be killed"
                    ) from None
            except asyncio.CancelledError:
                with contextlib.suppress(ChannelLost):
                    self._queue(_frame(proto.KILL, exec_id))
                raise
        finally:
            self._pending.pop(exec_id, None)
        return ExecOutput(
            exit_code=code,
            stdout=bytes(pending.stdout),
            stderr=bytes(pending.stderr),
            timed_out=timed_out,
            trace=pending.trace,
        )

    # -- the loop that serves the socket -------------------------------------------------

    def _attach(self) -> asyncio.AbstractEventLoop:
        """Serve the socket on the running loop (moved here from a loop that is done)."""
        loop = asyncio.get_running_loop()
        old = self._loop
        if old is loop:
            return loop
        if old is not None and not old.is_closed():
            if old.is_running() and self._pending:
                raise RuntimeError(
                    "this sandbox's exec channel is serving commands on another event loop; "
                    "run a sandbox's commands from one loop at a time"
                )
            old.remove_reader(self._fd)
            old.remove_writer(self._fd)
        # commands of a loop that ended without them: nobody waits for their results
        self._pending.clear()
        self._loop = loop
        loop.add_reader(self._fd, self._on_readable)
        if self._outbox:
            loop.add_writer(self._fd, self._on_writable)
        return loop

    def _queue(self, data: bytes) -> None:
        """Send now what the socket takes, the rest when the loop says it can take more."""
        if self.closed:
            raise ChannelLost("the exec channel is closed")
        if not self._outbox:
            try:
                sent = self._conn.send(data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._lost(f"the exec server is gone ({exc})")
                raise ChannelLost(f"the exec server is gone ({exc})") from exc
            data = data[sent:]
            if not data:
                return
            if self._loop is not None and not self._loop.is_closed():
                self._loop.add_writer(self._fd, self._on_writable)
        self._outbox += data

    def _on_writable(self) -> None:
        try:
            sent = self._conn.send(self._outbox)
        except BlockingIOError:
            return
        except OSError as exc:
            return self._lost(f"the exec server is gone ({exc})")
        del self._outbox[:sent]
        if not self._outbox and self._loop is not None:
            self._loop.remove_writer(self._fd)

    def _on_readable(self) -> None:
        try:
            n = self._conn.recv_into(self._chunk)
        except BlockingIOError:
            return
        except OSError as exc:
            return self._lost(f"the exec channel broke: {exc}")
        if not n:
            return self._lost("the exec server closed its end")
        read = time.monotonic()
        inbox = self._inbox
        inbox += self._chunk_view[:n]
        head = proto.HEADER.size
        while len(inbox) >= head:
            kind, exec_id, size = proto.HEADER.unpack_from(inbox)
            if size > proto.MAX_PAYLOAD + 4096:
                return self._lost(f"the exec channel broke: a frame of {size} bytes")
            if len(inbox) < head + size:
                break
            payload = bytes(inbox[head : head + size])
            del inbox[: head + size]
            pending = self._pending.get(exec_id)
            if pending is None:
                continue  # a cancelled command's late output
            if kind == proto.STDOUT:
                pending.stdout += payload
            elif kind == proto.STDERR:
                pending.stderr += payload
            elif kind == proto.EXIT:
                body = json.loads(payload)
                code = int(body["code"])
                server_read, started, exited, server_sent = body["t"]
                pending.trace = ExecTrace(
                    sent=pending.sent,
                    server_read=server_read,
                    started=started,
                    exited=exited,
                    server_sent=server_sent,
                    read=read,
                )
                if not pending.future.done():
                    pending.future.set_result(code)

    def _lost(self, reason: str) -> None:
        """The server is gone: every waiting command fails ``ChannelLost``."""
        self._shut()
        pending, self._pending = list(self._pending.values()), {}
        for p in pending:
            if not p.future.done():
                with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                    p.future.set_exception(ChannelLost(reason))

    def _shut(self) -> None:
        self.closed = True
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # a loop running on another thread
                loop.remove_reader(self._fd)
                loop.remove_writer(self._fd)
        with contextlib.suppress(OSError):
            self._conn.shutdown(socket.SHUT_RDWR)
        self._conn.close()

    def close(self) -> None:
        """Stop using the server (idempotent); commands still running fail ``ChannelLost``."""
        if not self.closed:
            self._lost("the exec channel is closed")


def _frame(kind: int, exec_id: int, payload: bytes = b"") -> bytes:
    return proto.HEADER.pack(kind, exec_id, len(payload)) + payload
