"""Server-sent events, framed the way each API's SDK parses them."""

from __future__ import annotations

from typing import Any

import msgspec

_encode = msgspec.json.Encoder().encode


def event(data: Any, name: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line, one ``data:`` line, a blank line."""
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + _encode(data) + b"\n\n"


OPENAI_DONE = b"data: [DONE]\n\n"


def json_bytes(data: Any) -> bytes:
    return _encode(data)


def pieces(text: str, tokens: tuple[tuple[str, float], ...]) -> list[str]:
    """Split streamed text per generated token when the tokens spell it exactly."""
    if tokens and "".join(t for t, _ in tokens) == text:
        return [t for t, _ in tokens if t]
    return [text] if text else []
