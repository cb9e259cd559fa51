"""The host end of the proxy link: a unix socket that forwards to the proxy's TCP address.

Why a unix socket: a sandbox in its own network namespace (docker ``--network none``,
bubblewrap ``--unshare-net``) reaches nothing at all over IP, not the host, not the LAN, not
other containers. The only way out is a file: the per-trial socket folder, bind-mounted into
the sandbox, where ``relay.py`` (inside) turns it back into ``127.0.0.1:PORT``. The host end
connects only to the one proxy address the trial registered, so the agent reaches the proxy
and nothing else. Closing the link (before the verifier phase) cuts even that.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from slr.sandboxing.host_relay import HostRelay

RELAY_SCRIPT = Path(__file__).with_name("relay.py")
EXEC_SERVER_SCRIPT = Path(__file__).with_name("exec_server.py")
SOCKET_NAME = "proxy.sock"
LINK_PREFIX = "slr-link-"
OWNER_FILE = "owner.pid"


def inner_proxy_url(host_url: str, port: int) -> tuple[str, tuple[str, int]]:
    """(the URL as seen inside the sandbox, the (host, port) the host end must dial)."""
    parts = urlsplit(host_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"proxy URL {host_url!r} is not an http(s) URL with a host")
    target = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    inner = urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, ""))
    return inner, target


class ProxyLink:
    """One trial's link: a folder holding ``relay.py`` (with ``exec_server.py``) and
    ``proxy.sock``, to bind-mount.

    The host end is a ``HostRelay`` on the unix socket: its own threads, not the caller's
    event loop, so a sandbox may be driven from several loops (tests) and a busy loop never
    stalls the agent's traffic.
    """

    def __init__(self, *, parent: str | None = None) -> None:
        # Short names: a unix socket path must stay under ~108 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix=LINK_PREFIX, dir=parent))
        self.dir.chmod(0o755)
        (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        shutil.copy(RELAY_SCRIPT, self.dir / "relay.py")
        shutil.copy(EXEC_SERVER_SCRIPT, self.dir / "exec_server.py")  # relay.py --exec
        self.socket_path = self.dir / SOCKET_NAME
        self._target: tuple[str, int] | None = None
        self._relay: HostRelay | None = None

    def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        self.socket_path.chmod(0o777)  # any sandbox user may dial the proxy
        listener.listen(128)
        self._relay = HostRelay(listener, target=self._target)

    def set_target(self, host: str, port: int) -> None:
        self._target = (host, port)
        if self._relay is not None and not self._relay.closed:
            self._relay.target = self._target

    @property
    def alive(self) -> bool:
        """Whether the link still forwards: started, not closed, its socket in place."""
        return self._relay is not None and not self._relay.closed and self.socket_path.exists()

    def close(self) -> None:
        """Stop forwarding and cut open connections (idempotent)."""
        self._target = None
        if self._relay is not None:
            self._relay.close()
        self.socket_path.unlink(missing_ok=True)

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def remove_stale_links(parent: str | None = None) -> int:
    """Remove link folders whose owning process died without removing them; returns how many."""
    removed = 0
    for d in Path(parent or tempfile.gettempdir()).glob(f"{LINK_PREFIX}*"):
        try:
            pid = int((d / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed += 1
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
