"""Property-based fuzzing over the request schemas: no input gets a 5xx.

Bodies are drawn from the JSON schemas of the proxy's own request types (``msgspec``
generates them; ``from_schema`` below turns one into a hypothesis strategy) and from
mutations of those (a field replaced by random JSON, a field dropped, random JSON alone).
Every answer must be a 2xx or a 4xx in the right API's error shape.
"""

from __future__ import annotations

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from slr.proxy import anthropic, openai

pytestmark = pytest.mark.slow

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def from_schema(schema: dict, defs: dict | None = None) -> st.SearchStrategy:
    """A strategy for the JSON-schema subset msgspec emits for Structs."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(defs[name], defs))
    if "anyOf" in schema:
        return st.one_of([from_schema(s, defs) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        if not props:
            return st.dictionaries(st.text(max_size=6), _json, max_size=3)
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: from_schema(v, defs) for k, v in props.items() if k in required},
            optional={k: from_schema(v, defs) for k, v in props.items() if k not in required},
        )
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs), max_size=3)
    return {
        "string": st.text(max_size=12),
        "integer": st.integers(-3, 100),
        "number": st.floats(-1, 3, allow_nan=False),
        "boolean": st.booleans(),
        "null": st.none(),
    }.get(kind, _json)


def _schema(cls) -> dict:
    return msgspec.json.schema(cls)


def _small(body: dict, roles: tuple[str, ...]) -> dict:
    """Nudge a schema-valid body towards one the proxy accepts, so both paths get fuzzed."""
    body = dict(body)
    body["model"] = "policy"
    messages = [dict(m) for m in body.get("messages") or []]
    for i, m in enumerate(messages):
        m["role"] = roles[i % len(roles)]
    body["messages"] = messages or [{"role": "user", "content": "hi"}]
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


def _bodies(cls, roles):
    valid = from_schema(_schema(cls)).map(lambda b: _small(b, roles))
    return st.one_of(valid, valid.flatmap(_mutate))


def _check(resp: httpx.Response, api: str) -> None:
    event(f"status {resp.status_code}")
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
@given(body=_bodies(openai.ChatCompletionRequest, ("user", "assistant", "system", "tool")))
def test_openai_schema_fuzz(proxy, body):
    session = proxy.open_session("fuzz-openai")
    try:
        resp = httpx.post(f"{session.openai_base_url}/chat/completions", json=body, timeout=60)
        _check(resp, "openai")
    finally:
        proxy.close_session(session)


@FUZZ
@given(body=_bodies(anthropic.MessagesRequest, ("user", "assistant")))
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
