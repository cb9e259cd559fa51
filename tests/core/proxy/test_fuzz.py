"""Property-based fuzzing over the request schemas: no input gets a 5xx.

Bodies come from the JSON schemas of the proxy's own request types (valid ones, which
must be answered 200) and from mutations of them (wrong types, dropped and extra keys,
random JSON), which must get a 4xx in the right API's error shape.
"""

from __future__ import annotations

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from slr.proxy import anthropic, openai

pytestmark = pytest.mark.slow

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _schema(cls) -> dict:
    schema = msgspec.json.schema(cls)
    return schema


def _small(body: dict) -> dict:
    body = dict(body)
    body["model"] = "policy"
    body["stream"] = bool(body.get("stream"))
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int):
            body[key] = max(-1, min(body[key], 2))
    if "max_tokens" not in body or not isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = 2
    body.pop("max_completion_tokens", None)
    return body


def _mutate(base):
    keys = st.sampled_from(sorted(base) or ["model"])
    return st.one_of(
        st.builds(lambda k, v: {**base, k: v}, keys, _json),
        st.builds(lambda k: {kk: vv for kk, vv in base.items() if kk != k}, keys),
        _json,
    )


def _bodies(cls):
    valid = from_schema(_schema(cls)).filter(lambda b: isinstance(b, dict)).map(_small)
    return st.one_of(valid, valid.flatmap(_mutate))


def _check(resp: httpx.Response, api: str) -> None:
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        body = resp.json()
        if api == "anthropic":
            assert body["type"] == "error" and body["error"]["message"]
        else:
            assert body["error"]["message"] and "type" in body["error"]


FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)


@FUZZ
@given(body=_bodies(openai.ChatCompletionRequest))
def test_openai_schema_fuzz(proxy, body):
    session = proxy.open_session("fuzz-openai")
    try:
        resp = httpx.post(f"{session.openai_base_url}/chat/completions", json=body, timeout=60)
        _check(resp, "openai")
    finally:
        proxy.close_session(session)


@FUZZ
@given(body=_bodies(anthropic.MessagesRequest))
def test_anthropic_schema_fuzz(proxy, body):
    session = proxy.open_session("fuzz-anthropic")
    try:
        resp = httpx.post(f"{session.anthropic_base_url}/v1/messages", json=body, timeout=60)
        _check(resp, "anthropic")
        resp = httpx.post(
            f"{session.anthropic_base_url}/v1/messages/count_tokens", json=body, timeout=60
        )
        _check(resp, "anthropic")
    finally:
        proxy.close_session(session)
