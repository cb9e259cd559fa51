"""Helpers for ``SandboxBackendTests``: a stand-in proxy, a probing agent, network probes.

Everything here contacts only this machine: loopback listeners the test opens, and
addresses the backend's own test module supplies (its containers, its gateway).
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from slr.contracts import AgentAdapter, AgentOutcome, Bundle, Endpoint, Reward, Sandbox
from slr.tasks import Task

PROXY_REPLY = "slr-stand-in-proxy-ok"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"reply": PROXY_REPLY, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def stand_in_proxy() -> Iterator[str]:
    """A stand-in for the proxy: an HTTP server on the host's loopback; yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def decoy_listener() -> Iterator[int]:
    """A TCP listener on all the host's addresses that is NOT the proxy; yields its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen(16)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                conn.close()
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        sock.close()


# Runs inside the sandbox with its python3: connects to each (host, port) and reports.
CONNECT_PROBE = r"""
import json, socket, sys
out = {}
for target in json.loads(sys.argv[1]):
    host, port = target
    try:
        socket.create_connection((host, port), timeout=3).close()
        out[f"{host}:{port}"] = "open"
    except OSError as exc:
        out[f"{host}:{port}"] = f"closed: {exc}"
print(json.dumps(out))
"""

HTTP_PROBE = r"""
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1] + "/models", timeout=10).read().decode())
except Exception as exc:
    print(f"error: {exc}")
"""

INTERFACES = "import sys; print(open('/proc/net/dev').read())"


async def probe_connect(sandbox: Sandbox, targets: Sequence[tuple[str, int]]) -> dict[str, str]:
    res = await sandbox.exec(
        ["python3", "-c", CONNECT_PROBE, json.dumps([list(t) for t in targets])]
    )
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def interfaces(proc_net_dev: str) -> set[str]:
    return {line.split(":")[0].strip() for line in proc_net_dev.splitlines()[2:] if ":" in line}


# What the agent phase must not see, probed from inside (the fix-median-like task layout).
AGENT_VIEW = r"""
echo "tests=$(ls -A /tests 2>/dev/null | wc -l)"
echo "solution=$(ls -A /solution 2>/dev/null | wc -l)"
echo "found=$(find / -xdev \( -path /proc -o -path /sys -o -path /usr -o -path /dev \) -prune -o \( -name test.sh -o -name solve.sh -o -name test_hidden.py \) -print 2>/dev/null | tr '\n' ' ')"
echo "commits=$(git rev-list --all --count 2>/dev/null)"
echo "subjects=$(git log --all --format=%s 2>/dev/null | tr '\n' '|')"
echo "objects=$(git cat-file --batch-all-objects --batch-check 2>/dev/null | wc -l)"
echo "reflog=$(git reflog 2>/dev/null | wc -l)"
echo "taskpath=$(ls -d "$SLR_PROBE_TASK_PATH" 2>/dev/null | wc -l)"
"""


def parse_view(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.strip().splitlines() if "=" in line)


@attrs.define
class ProbeAgent(AgentAdapter):
    """A test agent: records what the agent phase can see and reach, then does nothing."""

    targets: Sequence[tuple[str, int]] = ()
    protocol = "openai"
    needs_model = False
    accepts_task = True
    seen: dict[str, Any] = attrs.field(factory=dict)

    def bundle(self) -> Bundle:
        from pathlib import Path

        return Bundle(path=Path("/nonexistent-slr-bundle"), version="probe")

    async def run(
        self,
        sandbox: Sandbox,
        instruction: str,
        endpoint: Endpoint,
        *,
        timeout_s: float,
        task: Task | None = None,
    ) -> AgentOutcome:
        assert task is not None, "the trial runner passes task= (accepts_task)"
        view = await sandbox.exec(AGENT_VIEW, env={"SLR_PROBE_TASK_PATH": str(task.path)})
        self.seen["view"] = parse_view(view.stdout)
        self.seen["endpoint"] = endpoint.base_url
        self.seen["proxy"] = (
            await sandbox.exec(["python3", "-c", HTTP_PROBE, endpoint.base_url])
        ).stdout
        self.seen["connect"] = await probe_connect(sandbox, self.targets)
        self.seen["interfaces"] = interfaces(
            (await sandbox.exec(["python3", "-c", INTERFACES])).stdout
        )
        return AgentOutcome(exit_code=0)


@attrs.define
class ProbeVerifier:
    """Wraps a verifier: records the git history the verifier phase sees, then delegates."""

    inner: Any
    seen: dict[str, Any] = attrs.field(factory=dict)

    async def verify(self, sandbox: Sandbox, task: Task) -> Reward:
        log = await sandbox.exec("git log --format=%s 2>&1")
        self.seen["subjects"] = log.stdout.strip().splitlines()
        return await self.inner.verify(sandbox, task)
