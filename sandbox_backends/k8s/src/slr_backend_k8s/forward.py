"""How pods reach the proxy: one TCP forwarder per sandbox, on this machine.

The proxy binds loopback by default, which no pod can reach. Each sandbox gets a listener on
the address this machine has towards its pod (``bind_host``: on a single-node dev cluster,
the pod network's gateway) that forwards to the proxy's real address. It accepts only
connections from its own pod's IP, so one trial cannot use another's link even where
NetworkPolicy is not enforced, and it is closed when the agent phase ends.

Threads, not asyncio: the backend may be driven from several event loops, and a busy loop
must never stall an agent's traffic.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import structlog

log = structlog.get_logger()


def local_address_towards(ip: str) -> str:
    """The address of this machine on the route to ``ip`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))
        return s.getsockname()[0]


class Forwarder:
    """Listen on ``bind_host`` (a free port) and pipe each accepted connection to ``target``."""

    def __init__(self, bind_host: str, *, allowed_peer: str | None) -> None:
        self.bind_host = bind_host
        self.allowed_peer = allowed_peer
        self.target: tuple[str, int] | None = None
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((bind_host, 0))
        except OSError as exc:
            listener.close()
            raise OSError(
                f"cannot listen on {bind_host} for the pods' proxy link: {exc}. Set "
                f"backend.proxy_host to an address of this machine that the pods can reach, "
                f"or proxy_forward = false when the proxy itself listens where pods reach it"
            ) from exc
        listener.listen(128)
        self.port: int = listener.getsockname()[1]
        self._listener: socket.socket | None = listener
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            if self.allowed_peer is not None and peer[0] != self.allowed_peer:
                log.warning(
                    "proxy link: refused a connection from another address",
                    peer=peer[0],
                    expected=self.allowed_peer,
                )
                conn.close()
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        target = self.target
        if target is None:
            conn.close()
            return
        try:
            up = socket.create_connection(target, timeout=10)
            up.settimeout(None)
        except OSError as exc:
            log.warning("proxy link: proxy unreachable", target=target, error=str(exc))
            conn.close()
            return
        with self._lock:
            if self._listener is None:
                conn.close()
                up.close()
                return
            self._open.update((conn, up))
        back = threading.Thread(target=_pipe, args=(up, conn), daemon=True)
        back.start()
        _pipe(conn, up)
        back.join()
        with self._lock:
            self._open.difference_update((conn, up))
        conn.close()
        up.close()

    def close(self) -> None:
        """Stop listening and cut the open connections. Idempotent."""
        self.target = None
        with self._lock:
            listener, self._listener = self._listener, None
            current = list(self._open)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for s in current:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                s.shutdown(how)
