"""How pods reach the proxy: one TCP forwarder per sandbox, on this machine.

The proxy binds loopback by default, which no pod can reach. Each sandbox gets a listener on
the address this machine has towards its pod (``bind_host``: on a single-node dev cluster,
the pod network's gateway) that forwards to the proxy's real address. It accepts only
connections from its own pod's IP, so one trial cannot use another's link even where
NetworkPolicy is not enforced, and it is closed when the agent phase ends.

The relay itself (threads, one target, cut on close) is ``slr.sandboxing.HostRelay``, shared
with the unix-socket link of ``network = "loopback"`` and the other backends.
"""

from __future__ import annotations

import socket

import structlog

from slr.sandboxing import HostRelay

log = structlog.get_logger()


def local_address_towards(ip: str) -> str:
    """The address of this machine on the route to ``ip`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))
        return s.getsockname()[0]


class Forwarder:
    """Listen on ``bind_host`` (a free port) and relay each connection from ``allowed_peer``
    to ``target`` (``slr.sandboxing.HostRelay``, the same relay as the unix-socket link)."""

    def __init__(self, bind_host: str, *, allowed_peer: str | None) -> None:
        self.bind_host = bind_host
        self.allowed_peer = allowed_peer
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
        self._relay = HostRelay(listener, accept_peer=self._accept_peer)

    @property
    def target(self) -> tuple[str, int] | None:
        return self._relay.target

    @target.setter
    def target(self, value: tuple[str, int] | None) -> None:
        self._relay.target = value

    def _accept_peer(self, peer: tuple) -> bool:
        if self.allowed_peer is None or peer[0] == self.allowed_peer:
            return True
        log.warning(
            "proxy link: refused a connection from another address",
            peer=peer[0],
            expected=self.allowed_peer,
        )
        return False

    def close(self) -> None:
        """Stop listening and cut the open connections. Idempotent."""
        self._relay.close()
