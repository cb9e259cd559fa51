"""Connecting to Ray: a private local instance, or an existing cluster, once per process.

``connect(address)`` is idempotent and reference-counted: every user calls it and
``release()``s what it got; Ray is shut down when the last user releases it, and only if
this module started it. An existing connection (made by ``ray.init`` elsewhere, e.g. a test
fixture's cluster) is reused and never shut down from here.

Addresses (``[run] ray_address``, ``slr run --ray-address``):

- unset or ``"local"``: a private Ray on this machine, started now. It never joins a Ray left
  running (or crashed) under the temp folder, starts no dashboard, sends no usage
  statistics, and keeps all its traffic on 127.0.0.1;
- ``"auto"``: the cluster this machine joined with ``ray start`` (or ``$RAY_ADDRESS``);
- ``"host:port"``: that cluster's GCS; ``"ray://host:port"``: through the Ray client.

Why the loopback setting is an environment variable: Ray resolves "127.0.0.1" to the
machine's interface address everywhere a node or a driver announces itself, unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is 0 (its switch for "this is a single machine"),
which it reads once, at import. ``stay_on_loopback`` applies the settings (to the
environment of the Ray processes to come, and to this process's Ray if it is imported
already); a local start calls it, and so does the test cluster
(``slr_testkit.ray_cluster``), so its head, its nodes and the driver stay on 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading
from typing import Any

import structlog
from attrs import define

from slr.errors import UsageError

log = structlog.get_logger()

LOCAL = "local"
LOOPBACK = "127.0.0.1"
_ADDRESS = re.compile(r"^(ray://)?[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


def loopback_environment() -> dict[str, str]:
    """Environment settings under which every Ray process of this machine stays on
    127.0.0.1 and contacts nothing outside it (read by Ray at import)."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


#: How to install Ray, named by every refusal that needs it.
CLUSTER_EXTRA = "pip install 'slr-core[cluster]'"


def ray_installed() -> bool:
    """Whether Ray can be imported here (without importing it: that takes a second)."""
    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def check_address(value: str | None) -> str | None:
    """``value`` if it is a Ray address slr understands, else a ``UsageError`` naming it."""
    if value is None or value in (LOCAL, "auto") or _ADDRESS.match(value):
        return value
    raise UsageError(
        f"ray_address = {value!r} is not a Ray address; use 'local' (a private Ray on this "
        f"machine), 'auto' (the cluster joined with `ray start`), 'host:port' or "
        f"'ray://host:port'"
    )


@define(kw_only=True)
class _State:
    users: int = 0
    started: bool = False  # this module ran ray.init, so it shuts Ray down at the end
    address: str | None = None


_state = _State()
_lock = threading.Lock()


@define(kw_only=True, eq=False)
class Connection:
    """One user's hold on the process's Ray connection; ``release`` it once when done."""

    address: str
    started: bool
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        release()


def connect(address: str | None = None, *, num_cpus: int | None = None) -> Connection:
    """The process's Ray connection, made now if there is none (see the module docs).

    ``num_cpus`` sizes a local start (default: the machine's cores); ignored otherwise.
    """
    check_address(address)
    if not ray_installed():
        raise UsageError(f"Ray is not installed, and this needs it: {CLUSTER_EXTRA}")
    with _lock:
        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                _state.users += 1
                if not _state.started and _state.address is None:
                    _state.address = _current_address(ray)
                return Connection(address=_state.address or "", started=_state.started)
        if address is None or address == LOCAL:
            _start_local(num_cpus)
        else:
            _join(address)
        _state.users = 1
        return Connection(address=_state.address or "", started=_state.started)


def release() -> None:
    """Drop one user; the last one shuts Ray down if this module started it."""
    with _lock:
        if not _state.users:
            return
        _state.users -= 1
        if _state.users:
            return
        if _state.started:
            import ray

            ray.shutdown()
            log.info("local ray stopped")
        _state.started = False
        _state.address = None


def live_nodes() -> list[dict[str, float]]:
    """The resources of each live node of the Ray this process is connected to."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def cluster_nodes(address: str) -> list[dict[str, float]]:
    """The resources of each live node of the Ray cluster at ``address`` (joins it briefly)."""
    conn = connect(address)
    try:
        return live_nodes()
    finally:
        conn.release()


def stay_on_loopback() -> None:
    """Keep the Ray processes this process starts, and its own driver, on 127.0.0.1.

    Sets ``loopback_environment()`` for the processes started from now on; if this process
    imported Ray already (some library may have), it read its switch at that import, so
    the switch is set where Ray reads it at each call as well."""
    os.environ.update(loopback_environment())
    if "ray" in sys.modules:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


def _start_local(num_cpus: int | None) -> None:
    stay_on_loopback()
    import ray

    # address="local": never join a Ray found under /tmp/ray (possibly a dead one).
    info = ray.init(
        address=LOCAL,
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address=LOOPBACK,
        configure_logging=False,
        log_to_driver=True,
    )
    _state.started = True
    _state.address = str(getattr(info, "address_info", {}).get("gcs_address") or LOCAL)
    log.info("local ray started", address=_state.address, num_cpus=num_cpus)


def _join(address: str) -> None:
    import ray

    try:
        ray.init(address=address, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UsageError(
            f"could not connect to the Ray cluster at ray_address = {address!r}: {exc}. "
            f"Start it (`ray start --head` on the head node) or fix the address"
        ) from exc
    _state.started = False
    _state.address = address
    log.info("joined ray cluster", address=address)


def _current_address(ray: Any) -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # an older Ray without it: the address is only for logs
        return "existing"
