"""A client that asks for a long streamed answer and then reads nothing is cut off after
``[proxy] write_timeout_s`` and its generation cancelled: a slow reader cannot hold the
engine (or the proxy's memory) for as long as it likes.

The client is a raw socket with a small receive buffer that sends its request, reads the
first bytes and then stops reading. Without the write timeout, uvicorn waits for the
buffer to drain for ever and the generation stays parked in the engine: this test then
sees no cut and no cancellation.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from slr.config import ProxySection
from slr.contracts import SamplingParams
from slr.proxy import Proxy, ProxyThread

pytestmark = pytest.mark.timeout(60)

WRITE_TIMEOUT_S = 1.0
MAX_TOKENS = 1900
# Every chunk of a stream repeats the model's name: a long one makes each token ~4 KB, so
# the proxy's buffers fill after tens of tokens instead of thousands.
MODEL = "policy-" + "x" * 4000


@pytest.fixture(scope="module", params=["httptools", "h11"])  # [proxy] http_parser
def chatty_proxy(engine, request):
    config = ProxySection(
        http_parser=request.param,
        model_names=[MODEL],
        client_sampling="honor",
        write_timeout_s=WRITE_TIMEOUT_S,
    )
    proxy = Proxy(engine, config, sampling=SamplingParams(max_tokens=MAX_TOKENS))
    with ProxyThread(proxy):
        yield proxy


def _wait_for(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_a_reader_that_stops_reading_is_cut_off_and_its_generation_cancelled(chatty_proxy, engine):
    session = chatty_proxy.open_session("slow-reader")
    before = engine.stats()
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Talk for ever."}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "seed": 7,
        }
    ).encode()
    request = (
        f"POST /s/{session.token}/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    sock = socket.socket()
    # a small window: the proxy's buffers fill after a few dozen kilobytes
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    try:
        sock.connect(("127.0.0.1", chatty_proxy.port))
        sock.sendall(request)
        assert sock.recv(64).startswith(b"HTTP/1.1 200"), "the stream did not start"
        # ... and now read nothing: the engine must be stopped without our help
        _wait_for(lambda: engine.stats()["load"] == 0, "the engine let the sequence go", 20)
        after = engine.stats()
        generated = after["generated_tokens"] - before["generated_tokens"]
        assert after["cancelled"] == before["cancelled"] + 1, (before, after)
        assert generated < MAX_TOKENS, f"the whole answer ({generated} tokens) was generated"
        # the connection was cut: draining what is buffered ends in EOF or a reset
        sock.settimeout(10)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
    finally:
        sock.close()
        chatty_proxy.close_session(session)


def test_a_reader_that_keeps_reading_gets_the_whole_answer(chatty_proxy, engine):
    """The timeout is on stalled writes, not on long answers: a client that reads is never
    cut, however long its answer takes."""
    session = chatty_proxy.open_session("steady-reader")
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Talk."}],
            "max_tokens": 300,
            "stream": True,
            "seed": 7,
        }
    ).encode()
    request = (
        f"POST /s/{session.token}/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body
    received = b""
    with socket.create_connection(("127.0.0.1", chatty_proxy.port)) as sock:
        sock.sendall(request)
        sock.settimeout(30)
        while chunk := sock.recv(65536):
            received += chunk
    chatty_proxy.close_session(session)
    assert b"data: [DONE]" in received and b'finish_reason":"length' in received, received[-200:]
