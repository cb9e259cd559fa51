"""A connection's transport that sends a response's head together with its body.

uvicorn writes a response in two parts: the status line and headers when the app starts
the response, the body when the app sends it, a moment later in the same step of the
event loop. On a socket with ``TCP_NODELAY`` (which the proxy needs, see ``Proxy.start``)
that is two sends, two packets, and a client woken twice: once for a head it cannot use
yet, once for the body. At 32 sessions on shared cores every wake-up is a wait for a core,
on the proxy's side and on the client's. ``HeadWithBody`` holds a response's head until
the next write (the body: one send for both) or, when no body follows in the same step (a
stream that has nothing yet, a ``HEAD`` answer), until the end of that step.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: How every response head starts (uvicorn answers in HTTP/1.1, through httptools or h11).
_HEAD = b"HTTP/1.1 "


class HeadWithBody:
    """Wraps an ``asyncio.Transport``; everything but ``write``, ``close`` and ``abort``
    passes through unchanged."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._head is None and bytes(data[: len(_HEAD)]) == _HEAD:
            self._head = bytes(data)
            self._loop.call_soon(self.flush)
            return
        if self._head is not None:
            data, self._head = self._head + bytes(data), None
        self._transport.write(data)

    def flush(self) -> None:
        """Send a held head now (also at the end of the step that wrote it)."""
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._head = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
