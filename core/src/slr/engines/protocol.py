"""Reading what any OpenAI-style inference server answers: its JSON (or the start of its
text) and the message of its error bodies. No HTTP client here: protocol modules stay pure."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


def response_json(response: httpx.Response) -> Any:
    """The response's JSON, or the start of its text when it is not JSON."""
    try:
        return response.json()
    except ValueError:
        return response.text[:500]


def error_message(data: Any) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``)."""
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(data)


async def sse_data(response: httpx.Response) -> AsyncIterator[Any]:
    """The decoded JSON of each ``data:`` event of a streamed answer, up to ``[DONE]``
    (a payload that is not JSON raises ``json.JSONDecodeError``)."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


def short_repr(obj: Any, limit: int = 300) -> str:
    """``repr(obj)`` cut to ``limit`` characters, for error messages that quote an answer."""
    text = repr(obj)
    return text if len(text) <= limit else text[:limit] + "..."
