"""Errors the proxy returns, each rendered in the shape of the API the client speaks.

Handlers raise ``ApiError``; the server renders it as an OpenAI or an Anthropic error body
depending on the endpoint that was called, so an SDK raises its own typed exception.
"""

from __future__ import annotations

from typing import Any, Literal

Api = Literal["openai", "anthropic"]

# kind -> (HTTP status, OpenAI error type, Anthropic error type)
_KINDS: dict[str, tuple[int, str, str]] = {
    "invalid_request": (400, "invalid_request_error", "invalid_request_error"),
    "context_overflow": (400, "invalid_request_error", "invalid_request_error"),
    "authentication": (401, "invalid_request_error", "authentication_error"),
    "not_found": (404, "invalid_request_error", "not_found_error"),
    "model_not_found": (404, "invalid_request_error", "not_found_error"),
    "method_not_allowed": (405, "invalid_request_error", "invalid_request_error"),
    "request_timeout": (408, "invalid_request_error", "invalid_request_error"),
    "request_too_large": (413, "invalid_request_error", "request_too_large"),
    "unsupported_media": (415, "invalid_request_error", "invalid_request_error"),
    "engine_unavailable": (503, "server_error", "overloaded_error"),
    "internal": (500, "server_error", "api_error"),
}

_OPENAI_CODES = {
    "context_overflow": "context_length_exceeded",
    "authentication": "invalid_api_key",
    "model_not_found": "model_not_found",
    "request_too_large": "request_too_large",
    "request_timeout": "request_timeout",
}

#: Kinds answered before the request body was read whole: the connection cannot carry
#: another request, so the answer closes it.
CLOSES_CONNECTION = frozenset({"request_too_large", "request_timeout"})


class ApiError(Exception):
    """A request the proxy refuses (or could not serve), with a message for the agent's author."""

    def __init__(self, kind: str, message: str, *, param: str | None = None) -> None:
        if kind not in _KINDS:
            raise ValueError(f"unknown error kind {kind!r}; one of {sorted(_KINDS)}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param

    @property
    def status(self) -> int:
        return _KINDS[self.kind][0]

    def body(self, api: Api) -> dict[str, Any]:
        return error_body(api, self.kind, self.message, param=self.param)


def error_body(api: Api, kind: str, message: str, *, param: str | None = None) -> dict[str, Any]:
    _, openai_type, anthropic_type = _KINDS[kind]
    if api == "anthropic":
        return {"type": "error", "error": {"type": anthropic_type, "message": message}}
    return {
        "error": {
            "message": message,
            "type": openai_type,
            "param": param,
            "code": _OPENAI_CODES.get(kind),
        }
    }


def status_kind(status: int) -> str:
    """The error kind for a bare HTTP status raised by the framework (routing, limits)."""
    return {
        401: "authentication",
        404: "not_found",
        405: "method_not_allowed",
        408: "request_timeout",
        413: "request_too_large",
        415: "unsupported_media",
    }.get(status, "invalid_request" if 400 <= status < 500 else "internal")
