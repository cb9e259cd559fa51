"""A client that gives up frees the engine: its generation stops within one decode step.

Clients here are raw sockets (what a killed scaffold leaves behind is a closed socket,
nothing more polite), on both APIs, streaming and not. Every assertion is on the engine's
own counters (``HfEngine.stats()``: tokens generated, sequences cancelled, load), read
before the client goes and after the engine has let the sequence go. Each decode step
lasts at least ``STEP_S`` (see conftest), so "within one step" means: the step under way
when the client left, and at most the one under way when the proxy saw it leave.

Without the fix, a non-streamed call ran to ``max_tokens`` for a client long gone (the
issue's ``slr serve`` report): ~LONG tokens after the disconnect instead of <= 2.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
from reliability_support import LONG

from slr.proxy import ProxySessions

pytestmark = pytest.mark.timeout(60)

PROMPT = [{"role": "user", "content": "Write a long story."}]


def _request(api: str, token: str, *, stream: bool) -> bytes:
    if api == "openai":
        path = f"/s/{token}/v1/chat/completions"
        body = {"model": "policy", "messages": PROMPT, "max_tokens": LONG, "seed": 1}
    else:
        path = f"/s/{token}/v1/messages"
        body = {"model": "policy", "messages": PROMPT, "max_tokens": LONG}
    data = json.dumps({**body, "stream": stream}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def _wait_for(condition, what: str) -> None:
    """Poll the engine's counters (bounded) until ``condition()`` holds."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.002)
    raise AssertionError(f"the engine never reached: {what}")


class _Watch:
    """The engine's counters around one abandoned call."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.before = engine.stats()

    def generating(self) -> None:
        _wait_for(
            lambda: self.engine.stats()["generated_tokens"] >= self.before["generated_tokens"] + 3,
            "generating the call",
        )

    def mark(self) -> None:
        self.at_disconnect = self.engine.stats()["generated_tokens"]

    def assert_stopped_within_one_step(self) -> None:
        _wait_for(lambda: self.engine.stats()["load"] == 0, "no sequence in flight")
        after = self.engine.stats()
        extra = after["generated_tokens"] - self.at_disconnect
        assert after["cancelled"] == self.before["cancelled"] + 1, after
        assert extra <= 2, f"the engine generated {extra} tokens after the client left"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_disconnect_stops_the_generation(live_proxy, slow_engine, api, stream):
    session = live_proxy.open_session(f"gone-{api}-{stream}")
    watch = _Watch(slow_engine)
    sock = socket.create_connection(("127.0.0.1", live_proxy.port), timeout=30)
    sock.sendall(_request(api, session.token, stream=stream))
    if stream:
        assert sock.recv(64).startswith(b"HTTP/1.1 200")  # the stream started
    watch.generating()
    watch.mark()
    sock.close()
    watch.assert_stopped_within_one_step()
    trajectory = live_proxy.close_session(session)
    assert trajectory.num_calls == 0  # the abandoned call left nothing in the trajectory


CLIENT = """
import socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sock.sendall(sys.stdin.buffer.read())
print("sent", flush=True)
sock.recv(1 << 20)
"""


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_killed_scaffold_stops_the_generation(live_proxy, slow_engine, api):
    """A scaffold killed at its timeout (SIGKILL: no goodbye) frees the engine at once."""
    session = live_proxy.open_session(f"killed-{api}")
    watch = _Watch(slow_engine)
    scaffold = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(live_proxy.port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert scaffold.stdin and scaffold.stdout
    scaffold.stdin.write(_request(api, session.token, stream=False))
    scaffold.stdin.close()
    assert scaffold.stdout.readline() == b"sent\n"
    watch.generating()
    watch.mark()
    scaffold.kill()
    scaffold.wait()
    watch.assert_stopped_within_one_step()
    assert live_proxy.close_session(session).num_calls == 0


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_closing_the_session_stops_a_call_whose_client_stays(
    proxy_thread, live_proxy, slow_engine, stream
):
    """The trial closes the session when its agent phase ends (an agent timeout): a call
    still in flight, from a scaffold process that has not died (yet), stops with it."""
    sessions = ProxySessions(live_proxy, protocol="openai")
    session = live_proxy.open_session(f"timeout-{stream}")
    watch = _Watch(slow_engine)
    sock = socket.create_connection(("127.0.0.1", live_proxy.port), timeout=30)
    sock.sendall(_request("openai", session.token, stream=stream))
    watch.generating()
    watch.mark()
    trajectory = proxy_thread.call(sessions.close(session))
    watch.assert_stopped_within_one_step()
    assert trajectory.num_calls == 0
    answer = _read_until(sock, b"closed while this call was generating")
    sock.close()
    assert b"closed while this call was generating" in answer
    assert answer.startswith(b"HTTP/1.1 200" if stream else b"HTTP/1.1 401")
