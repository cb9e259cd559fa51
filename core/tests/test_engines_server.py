"""``slr.engines.server.ServerProcess``: a real child process on this machine, launched,
waited for on ``/health``, and stopped with every process of its group; and one that dies
before it is ready, reported with the end of its log."""

from __future__ import annotations

import asyncio
import os
import sys

import httpx
import pytest

from slr.contracts import EngineUnavailable
from slr.engines.server import ServerProcess, _group_members, free_port, replica_env

# A health endpoint that first starts a child in its own process group (as an inference
# server starts its workers), so stopping the server must take the child too.
SERVER = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


async def _ready(server: ServerProcess) -> None:
    async with httpx.AsyncClient() as client:
        await server.wait_ready(client, timeout_s=60)


@pytest.mark.timeout(90)
def test_a_launched_server_is_ready_on_health_and_stops_with_its_whole_group(tmp_path):
    port = free_port("127.0.0.1")
    server = ServerProcess(
        [sys.executable, "-c", SERVER, str(port)],
        kind="toy",
        url=f"http://127.0.0.1:{port}",
        index=3,
        log_dir=str(tmp_path),
    )
    try:
        asyncio.run(_ready(server))
        assert server.running
        assert server.log_path == tmp_path / "toy-3.log"
        assert "listening" in server.log_tail()
        pgid = server.process.pid
        assert os.getpgid(pgid) == pgid  # its own group, not ours
        assert len(_group_members(pgid)) == 2  # the server and the child it started
    finally:
        server.stop(grace_s=10)
    assert not server.running
    assert _group_members(pgid) == []


@pytest.mark.timeout(60)
def test_a_server_that_exits_before_it_is_ready_is_reported_with_its_log(tmp_path):
    server = ServerProcess(
        [sys.executable, "-c", "print('no GPU found'); raise SystemExit(3)"],
        kind="toy",
        url=f"http://127.0.0.1:{free_port('127.0.0.1')}",
        log_dir=str(tmp_path),
    )
    with pytest.raises(EngineUnavailable, match=r"(?s)toy server 0 exited with code 3.*no GPU"):
        asyncio.run(_ready(server))
    server.stop()


def test_each_replica_gets_its_own_gpus_in_turn():
    assert replica_env(["0", "1,2"], 1)["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert replica_env(["0", "1,2"], 2)["CUDA_VISIBLE_DEVICES"] == "0"
    assert replica_env([], 0).get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
