"""The host end of every proxy link: accept on a listening socket, pipe each connection to TCP.

Backends reach the proxy in two ways: a unix socket bind-mounted into the sandbox
(``ProxyLink``: docker, local, k8s ``network = "loopback"``) and a TCP listener that pods dial
(``slr_backend_k8s.forward.Forwarder``: k8s ``network = "policy"``). Both are this relay
over a different listener: it dials only the one target it was given, refuses peers the
caller's ``accept_peer`` rejects, and ``close()`` cuts the listener and every open
connection at once (the agent phase is over).

Threads, not asyncio: a sandbox may be driven from several event loops (tests), and a busy
loop must never stall an agent's traffic.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger()

DIAL_TIMEOUT_S = 10.0
CHUNK = 65536


class HostRelay:
    """Serve ``listener`` (already listening) on a daemon thread; forward to ``target``.

    ``target`` may be set (or changed) after start; a connection accepted while it is
    ``None`` is closed at once. ``accept_peer(address)`` decides per accepted connection
    (``None``: accept all).
    """

    def __init__(
        self,
        listener: socket.socket,
        *,
        target: tuple[str, int] | None = None,
        accept_peer: Callable[[Any], bool] | None = None,
    ) -> None:
        self.target = target
        self._accept_peer = accept_peer
        self._listener: socket.socket | None = listener
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    @property
    def closed(self) -> bool:
        return self._listener is None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            if self._accept_peer is not None and not self._accept_peer(peer):
                conn.close()
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        target = self.target
        if target is None:
            conn.close()
            return
        try:
            up = socket.create_connection(target, timeout=DIAL_TIMEOUT_S)
            up.settimeout(None)
        except OSError as exc:
            log.warning("proxy link: proxy unreachable", target=target, error=str(exc))
            conn.close()
            return
        with self._lock:
            if self._listener is None:  # closed meanwhile
                conn.close()
                up.close()
                return
            self._open.update((conn, up))
        back = threading.Thread(target=pipe, args=(up, conn), daemon=True)
        back.start()
        pipe(conn, up)
        back.join()
        with self._lock:
            self._open.difference_update((conn, up))
        conn.close()
        up.close()

    def close(self) -> None:
        """Stop forwarding, stop listening and cut the open connections. Idempotent."""
        self.target = None
        with self._lock:
            listener, self._listener = self._listener, None
            open_now = list(self._open)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for s in open_now:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF or an error, then half-close both directions."""
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                s.shutdown(how)
