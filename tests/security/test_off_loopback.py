"""A proxy reachable from other machines (``slr serve --host 0.0.0.0``) answers nothing
without a session token, not even its health check; on loopback the health check stays
open for local probes. Only this machine's loopback is contacted."""

from __future__ import annotations

import http.client
import json

import pytest

from slr.config import ProxySection
from slr.contracts import SamplingParams
from slr.proxy import Proxy, ProxyThread
from slr.proxy.server import is_loopback

pytestmark = pytest.mark.timeout(60)


def _get(port: int, path: str, token: str | None = None, method: str = "GET", body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    conn.request(method, path, body=json.dumps(body) if body else None, headers=headers)
    resp = conn.getresponse()
    status = resp.status
    resp.read()
    conn.close()
    return status


@pytest.fixture(scope="module")
def open_proxy(engine):
    config = ProxySection(model_names=["policy"], host="0.0.0.0")
    proxy = Proxy(engine, config, sampling=SamplingParams(max_tokens=2))
    with ProxyThread(proxy):
        yield proxy


CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("GET", "/", None),
        ("GET", "/health", None),
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", CHAT),
        ("POST", "/v1/messages", CHAT),
    ],
)
def test_off_loopback_every_route_needs_a_token(open_proxy, method, path, body):
    assert _get(open_proxy.port, path, method=method, body=body) == 401
    session = open_proxy.open_session(f"t-{path}")
    try:
        assert _get(open_proxy.port, path, session.token, method=method, body=body) == 200
    finally:
        open_proxy.close_session(session)
    # a closed session's token opens nothing either
    assert _get(open_proxy.port, path, session.token, method=method, body=body) == 401


def test_on_loopback_the_health_check_stays_open(proxy):
    assert _get(proxy.port, "/health") == 200
    assert _get(proxy.port, "/v1/models") == 401


@pytest.mark.parametrize(
    "host,loopback",
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
     ("example.org", False)],
)  # fmt: skip
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback
