"""Exec in a pod over the API server's websocket, one channel at a time.

Kubernetes exec has no working directory, environment, user or timeout of its own, and a
closed stream does not stop the process it started. So every command runs under a small
POSIX sh wrapper (``WRAPPER``) that exports a per-exec marker, changes directory, sets the
environment and switches user; a timeout or a cancelled call then kills every process
carrying that marker (``KILL_TREE``) through a second exec. stdin (uploads) is bounded with
``head -c``: the v4 channel protocol of older servers cannot close stdin.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import frozen

from slr_backend_k8s.api import (
    K8sError,
    KubeApi,
    PermissionDenied,
    PodGone,
    explain,
)

MARKER_VAR = "SLR_EXEC_ID"
STDOUT, STDERR, ERROR = 1, 2, 3
KILL_GRACE_S = 10.0  # after killing a timed-out command, how long its stream may take to end
STDIN_CHUNK = 256 * 1024

# $1 marker, $2 cwd, $3 user, $4 number of NAME=value words, then those words, then argv.
WRAPPER = r"""
export SLR_EXEC_ID="$1"
if [ -n "$2" ]; then cd "$2" || exit 126; fi
# rlimits (a pod spec has none): open files; one file's size in POSIX 512-byte blocks. Root
# in a pod lacks CAP_SYS_RESOURCE, so what is set here cannot be raised again.
if [ -n "$5" ]; then ulimit -n "$5" 2>/dev/null; fi
if [ -n "$6" ]; then ulimit -f "$6" 2>/dev/null; fi
u=$3; n=$4; shift 6
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done
if [ -z "$u" ] || [ "$u" = "$(id -un 2>/dev/null)" ] || [ "$u" = "$(id -u 2>/dev/null)" ]; then
  exec "$@"
fi
if command -v runuser >/dev/null 2>&1; then exec runuser -u "$u" -- "$@"; fi
if command -v setpriv >/dev/null 2>&1; then
  exec setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups -- "$@"
fi
exec su -s /bin/sh -c 'exec "$0" "$@"' "$u" "$@"
"""

# Kill every process whose environment holds the marker ($1): the command's whole tree, however
# it forked or re-parented. Repeated because a dying tree may still fork.
KILL_TREE = r"""
for _ in 1 2 3 4 5; do
  found=
  for p in /proc/[0-9]*; do
    if tr '\000' '\n' < "$p/environ" 2>/dev/null | grep -qx "SLR_EXEC_ID=$1"; then
      kill -9 "${p#/proc/}" 2>/dev/null && found=1
    fi
  done
  [ -z "$found" ] && break
done
true
"""

# Kill every process but PID 1 (pause), the idle main process ($1 in its argv) and this one.
END_PROCESSES = r"""
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = 1 ] || [ "$pid" = $$ ] && continue
  tr '\000' '\n' < "$p/cmdline" 2>/dev/null | grep -qx "$1" && continue
  kill -9 "$pid" 2>/dev/null
done
true
"""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def wrap(
    argv: Sequence[str],
    *,
    marker: str,
    cwd: str | None = None,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
    open_files: int | None = None,
    file_size_mb: int | None = None,
) -> list[str]:
    """The argv that runs ``argv`` with a marker, directory, environment, user and rlimits
    (``open_files``, ``file_size_mb``; None: left as the pod has them)."""
    words = []
    for name, value in (env or {}).items():
        if not _ENV_NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not valid")
        words.append(f"{name}={value}")
    return [
        "sh",
        "-c",
        WRAPPER,
        "slr-exec",
        marker,
        cwd or "",
        user or "",
        str(len(words)),
        "" if open_files is None else str(open_files),
        "" if file_size_mb is None else str(file_size_mb * 2048),
        *words,
        *argv,
    ]


@frozen(kw_only=True)
class StreamResult:
    """What one exec stream gave back. ``exit_code`` is None when no status arrived."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    cancelled: bool = False
    failure: str = ""
    """The server's message when the exec itself failed (not the command)."""


def parse_status(raw: bytes) -> tuple[int | None, str]:
    """The error channel's Status: (exit code, failure message for non-exit failures)."""
    if not raw.strip():
        return None, ""
    try:
        status = json.loads(raw)
    except ValueError:
        return None, raw.decode(errors="replace")
    if status.get("status") == "Success":
        return 0, ""
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message")), ""
                except (TypeError, ValueError):
                    break
    return None, str(status.get("message") or status)


def _handshake_error(exc: Any, doing: str, api: KubeApi, namespace: str) -> K8sError:
    """The stream helper reports every failure as status 0; recover the HTTP status."""
    text = str(getattr(exc, "reason", "") or exc)
    m = re.search(r"Handshake status (\d{3})", text)
    if m is None:
        return explain(exc, doing, api=api, namespace=namespace)
    code = int(m.group(1))
    if code in (401, 403):
        return PermissionDenied(
            f"permission denied while {doing} ({code}): {text[:300]}. The backend needs "
            f"'create' and 'get' on pods/exec in namespace {namespace!r} (see "
            f"docs/backends/k8s.md)"
        )
    if code == 404:
        return PodGone(f"the pod is gone ({doing}): {text[:300]}")
    return K8sError(f"exec failed while {doing} (HTTP {code}): {text[:300]}")


def open_stream(
    api: KubeApi, namespace: str, pod: str, container: str, argv: list[str], *, stdin: bool
) -> Any:
    from kubernetes.stream import stream

    try:
        return stream(
            api.stream_core().connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container=container,
            command=argv,
            stdin=stdin,
            stdout=True,
            stderr=True,
            tty=False,
            binary=True,
            _preload_content=False,
        )
    except Exception as exc:
        raise _handshake_error(exc, f"starting an exec in pod {pod}", api, namespace) from exc


def run(
    api: KubeApi,
    namespace: str,
    pod: str,
    container: str,
    argv: list[str],
    *,
    stdin: bytes | None = None,
    deadline: float | None = None,
    cancel: threading.Event | None = None,
    on_timeout: Callable[[], None] | None = None,
) -> StreamResult:
    """Run ``argv`` to its end (or to ``deadline`` / ``cancel``, then ``on_timeout``)."""
    from websocket import WebSocketException

    ws = open_stream(api, namespace, pod, container, argv, stdin=stdin is not None)
    out, err, status = bytearray(), bytearray(), bytearray()
    timed_out = cancelled = False
    killed_at: float | None = None
    try:
        if stdin is not None:
            view = memoryview(stdin)
            for start in range(0, len(view), STDIN_CHUNK):
                ws.write_stdin(bytes(view[start : start + STDIN_CHUNK]))
        while ws.is_open():
            now = time.monotonic()
            if killed_at is None:
                if cancel is not None and cancel.is_set():
                    cancelled = True
                elif deadline is not None and now >= deadline:
                    timed_out = True
                if (timed_out or cancelled) and on_timeout is not None:
                    killed_at = now
                    on_timeout()
                elif timed_out or cancelled:
                    break
            elif now - killed_at > KILL_GRACE_S:
                break
            wait = 0.5
            if deadline is not None and killed_at is None:
                wait = max(0.0, min(wait, deadline - now))
            ws.update(timeout=wait)
            out += ws.read_channel(STDOUT)
            err += ws.read_channel(STDERR)
            status += ws.read_channel(ERROR)
    except (WebSocketException, OSError) as exc:
        # The connection broke (pod deleted, API server gone); the caller checks the pod.
        err += f"\n[slr: exec stream broke: {type(exc).__name__}: {exc}]".encode()
    finally:
        with contextlib.suppress(WebSocketException, OSError):
            out += ws.read_channel(STDOUT)
            err += ws.read_channel(STDERR)
            status += ws.read_channel(ERROR)
        with contextlib.suppress(WebSocketException, OSError):
            ws.close()
    code, failure = parse_status(bytes(status))
    return StreamResult(
        exit_code=code,
        stdout=bytes(out),
        stderr=bytes(err),
        timed_out=timed_out,
        cancelled=cancelled,
        failure=failure,
    )
