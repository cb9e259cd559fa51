"""Reading what any OpenAI-style inference server answers: its JSON (or the start of its
text) and the message of its error bodies. No HTTP client here: protocol modules stay pure."""

from __future__ import annotations

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
