"""Bad input gets a 4xx in the right API's error shape, and the proxy keeps serving."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

OK_OPENAI = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OK_ANTHROPIC = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def assert_openai_error(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) == {"message", "type", "param", "code"}


def assert_anthropic_error(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error"
    assert isinstance(body["error"]["type"], str) and body["error"]["message"]


BAD_OPENAI = [
    ("not json", b"{"),
    ("array body", b"[]"),
    ("messages wrong type", {"model": "policy", "messages": "hi"}),
    ("missing messages", {"model": "policy"}),
    ("missing model", {"messages": [{"role": "user", "content": "x"}]}),
    ("role unknown", {"model": "policy", "messages": [{"role": "robot", "content": "x"}]}),
    ("content number", {"model": "policy", "messages": [{"role": "user", "content": 3}]}),
    ("empty messages", {"model": "policy", "messages": []}),
    ("temperature high", {**OK_OPENAI, "temperature": 9}),
    ("max_tokens zero", {**OK_OPENAI, "max_tokens": 0}),
    (
        "tool args not json",
        {
            "model": "policy",
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{"}}
                    ],
                }
            ],
        },
    ),
    (
        "image part",
        {
            "model": "policy",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
    ),
]

BAD_ANTHROPIC = [
    ("not json", b"nope"),
    ("missing max_tokens", {"model": "policy", "messages": [{"role": "user", "content": "x"}]}),
    ("messages wrong type", {**OK_ANTHROPIC, "messages": {"role": "user"}}),
    ("role unknown", {**OK_ANTHROPIC, "messages": [{"role": "tool", "content": "x"}]}),
    (
        "block unknown",
        {**OK_ANTHROPIC, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
    ),
    (
        "tool_use without name",
        {
            **OK_ANTHROPIC,
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}
            ],
        },
    ),
    ("system wrong type", {**OK_ANTHROPIC, "system": 5}),
    ("empty messages", {**OK_ANTHROPIC, "messages": []}),
    ("top_p high", {**OK_ANTHROPIC, "top_p": 3}),
]


def _post(url, body, **kw):
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={"content-type": "application/json"}, **kw)
    return httpx.post(url, json=body, **kw)


@pytest.mark.parametrize(("name", "body"), BAD_OPENAI, ids=[n for n, _ in BAD_OPENAI])
def test_openai_bad_bodies(session, name, body):
    assert_openai_error(_post(f"{session.openai_base_url}/chat/completions", body), 400)


@pytest.mark.parametrize(("name", "body"), BAD_ANTHROPIC, ids=[n for n, _ in BAD_ANTHROPIC])
def test_anthropic_bad_bodies(session, name, body):
    assert_anthropic_error(_post(f"{session.anthropic_base_url}/v1/messages", body), 400)
    assert_anthropic_error(
        _post(f"{session.anthropic_base_url}/v1/messages/count_tokens", body),
        400,
    ) if name not in ("missing max_tokens", "top_p high") else None


def test_unknown_sessions_models_sizes_and_routes(proxy, session):
    base = proxy.url
    assert_openai_error(_post(f"{base}/s/nope/v1/chat/completions", OK_OPENAI), 401)
    assert_openai_error(
        _post(f"{base}/v1/chat/completions", OK_OPENAI, headers={"authorization": "Bearer x"}), 401
    )
    assert_openai_error(_post(f"{base}/v1/chat/completions", OK_OPENAI), 401)
    assert_anthropic_error(_post(f"{base}/s/nope/v1/messages", OK_ANTHROPIC), 401)
    assert_anthropic_error(
        _post(f"{base}/v1/messages", OK_ANTHROPIC, headers={"x-api-key": "x"}), 401
    )
    assert_openai_error(
        _post(f"{session.openai_base_url}/chat/completions", {**OK_OPENAI, "model": "x"}), 404
    )
    assert_anthropic_error(
        _post(f"{session.anthropic_base_url}/v1/messages", {**OK_ANTHROPIC, "model": "x"}), 404
    )
    big = {
        **OK_OPENAI,
        "messages": [{"role": "user", "content": "x" * (proxy.config.max_body_bytes + 1)}],
    }
    assert_openai_error(_post(f"{session.openai_base_url}/chat/completions", big), 413)
    big = {
        **OK_ANTHROPIC,
        "messages": [{"role": "user", "content": "x" * (proxy.config.max_body_bytes + 1)}],
    }
    assert_anthropic_error(_post(f"{session.anthropic_base_url}/v1/messages", big), 413)
    assert_openai_error(httpx.get(f"{session.openai_base_url}/chat/completions"), 405)
    assert_anthropic_error(httpx.get(f"{session.anthropic_base_url}/v1/messages"), 405)
    assert_openai_error(httpx.post(f"{base}/v1/nothing-here"), 404)
    assert httpx.head(f"{base}/").status_code == 200
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    # and a good request still works on the same session
    ok = _post(f"{session.openai_base_url}/chat/completions", OK_OPENAI)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"
    ok = _post(f"{session.anthropic_base_url}/v1/messages", OK_ANTHROPIC)
    assert ok.status_code == 200 and ok.json()["type"] == "message"
