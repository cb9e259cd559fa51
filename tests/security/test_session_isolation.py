"""Session isolation: a token opens its own session and nothing else, and dies with it.

Each test holds the engine's own counter (tokens generated) beside the trajectories: a
refused request must neither reach the engine nor leave a trace in any session.
"""

from __future__ import annotations

import base64
import threading

import httpx
import pytest

from slr.proxy import session as session_module
from slr.proxy.session import new_token

pytestmark = pytest.mark.timeout(60)

ASK = {"model": "policy", "max_tokens": 2}


def _openai(url: str, key: str = "k", text: str = "hi") -> httpx.Response:
    body = {**ASK, "messages": [{"role": "user", "content": text}]}
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=30)


def _anthropic(url: str, key: str = "k", path: str = "/v1/messages") -> httpx.Response:
    body = {**ASK, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": key} if key else {}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=30)


def test_tokens_are_unguessable():
    tokens = [new_token() for _ in range(2000)]
    assert len(set(tokens)) == len(tokens)
    for token in tokens[:50]:
        secret = token.removeprefix("slr-")
        raw = base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))
        assert len(raw) * 8 >= 128, token


def test_sessions_get_distinct_unguessable_tokens(proxy):
    sessions = [proxy.open_session(f"t{i}") for i in range(20)]
    try:
        tokens = {s.token for s in sessions}
        assert len(tokens) == 20
        assert all(len(t) >= len("slr-") + 22 for t in tokens)  # >= 128 bits, base64
        # the engine knows a session by another name: the secret goes no further
        assert all(s.engine_id not in tokens for s in sessions)
    finally:
        for s in sessions:
            proxy.close_session(s)


def test_a_match_is_confirmed_in_constant_time(proxy, monkeypatch):
    calls = []
    real = session_module.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(session_module.hmac, "compare_digest", spy)
    s = proxy.open_session("digest")
    try:
        assert proxy.sessions.lookup(s.token) is s._state
        assert calls, "the token was not compared with hmac.compare_digest"
    finally:
        proxy.close_session(s)


def _near_misses(token: str, other: str) -> list[str]:
    flip = "A" if token[-1] != "A" else "B"
    return [
        token[:-1],  # a prefix
        token + "A",  # an extension
        token[:-1] + flip,  # one character off
        token.upper(),
        token.swapcase(),
        token.removeprefix("slr-"),
        token + "=",  # base64 padding: the same bytes to a decoder, not the same token
        token.replace("-", "+").replace("_", "/"),  # the same bytes in standard base64
        token[: len(token) // 2] + other[len(other) // 2 :],  # half of each
        "slr-" + "A" * (len(token) - 4),
        "",
    ]


def test_no_other_token_opens_a_session(proxy, engine):
    a, b = proxy.open_session("iso-a"), proxy.open_session("iso-b")
    before = engine.stats()["generated_tokens"]
    try:
        for guess in _near_misses(a.token, b.token):
            for resp in (
                _openai(f"{proxy.url}/v1", key=guess),
                _anthropic(proxy.url, key=guess),
                _anthropic(proxy.url, key=guess, path="/v1/messages/count_tokens"),
                httpx.get(f"{proxy.url}/v1/models", headers={"x-api-key": guess} if guess else {}),
            ):
                assert resp.status_code == 401, (guess, resp.status_code, resp.text)
            if guess and "/" not in guess and "+" not in guess:
                resp = _openai(f"{proxy.url}/s/{guess}/v1")
                assert resp.status_code == 401, (guess, resp.text)
        assert engine.stats()["generated_tokens"] == before  # nothing reached the engine
    finally:
        assert proxy.close_session(a).num_calls == 0
        assert proxy.close_session(b).num_calls == 0


def test_one_sessions_calls_land_in_that_session_only(proxy):
    a, b = proxy.open_session("own-a"), proxy.open_session("own-b")
    # a's URL with b's key: the URL decides, and it is a's
    assert _openai(a.openai_base_url, key=b.token, text="alpha").status_code == 200
    # b's key against the shared base URL: b's
    assert _anthropic(proxy.url, key=b.token).status_code == 200

    results: dict[str, list[int]] = {"a": [], "b": []}

    def converse(name, url, word):
        for _ in range(3):
            results[name].append(_openai(url, text=word).status_code)

    threads = [
        threading.Thread(target=converse, args=("a", a.openai_base_url, "alpha")),
        threading.Thread(target=converse, args=("b", b.openai_base_url, "bravo")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"a": [200] * 3, "b": [200] * 3}
    ta, tb = proxy.close_session(a), proxy.close_session(b)
    assert ta.num_calls == 4 and tb.num_calls == 4
    decode = proxy.renderer.decode
    text_a = " ".join(decode(s.token_ids) for s in ta.segments)
    text_b = " ".join(decode(s.token_ids) for s in tb.segments)
    assert "alpha" in text_a and "bravo" not in text_a
    assert "bravo" in text_b and "alpha" not in text_b


def test_a_closed_sessions_token_is_dead(proxy, engine):
    s = proxy.open_session("closed")
    assert _openai(s.openai_base_url).status_code == 200
    trajectory = proxy.close_session(s)
    assert trajectory.num_calls == 1
    before = engine.stats()["generated_tokens"]
    for resp in (
        _openai(s.openai_base_url),
        _openai(f"{proxy.url}/v1", key=s.token),
        _anthropic(s.anthropic_base_url),
        _anthropic(proxy.url, key=s.token, path="/v1/messages/count_tokens"),
        httpx.get(f"{s.openai_base_url}/models"),
    ):
        assert resp.status_code == 401, resp.text
        assert "closed" in resp.text
    assert engine.stats()["generated_tokens"] == before
    assert s._state.trajectory() == trajectory  # nothing appended after the close
