"""OpenAI Chat Completions: request schema, conversion, responses and stream chunks.

Accepted and ignored (the policy cannot honour them, real clients send them):
``reasoning_effort``, ``prompt_cache_key``, ``parallel_tool_calls``, ``user``, ``metadata``,
``store``, ``frequency_penalty``, ``presence_penalty``, ``logit_bias``, ``response_format``,
``service_tier``, ``modalities`` and any other unknown field.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from slr.proxy import sse
from slr.proxy.errors import ApiError
from slr.proxy.messages import Message, Role, Tool, ToolCall
from slr.proxy.session import ChatRequest, ChatResult, StreamEvent, TextDelta


class Function(msgspec.Struct, kw_only=True):
    name: str
    arguments: str | dict[str, Any] | None = None


class RequestToolCall(msgspec.Struct, kw_only=True):
    function: Function
    id: str | None = None
    type: str = "function"


class RequestMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[RequestToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionDef(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class RequestTool(msgspec.Struct, kw_only=True):
    function: FunctionDef
    type: str = "function"


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class ChatCompletionRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[RequestMessage]
    tools: list[RequestTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    n: int | None = None
    seed: int | None = None


_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


def _text(content: str | list[dict[str, Any]] | None, where: str, *, lenient: bool = False) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    out = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal":
            continue
        elif lenient:  # a tool's output: never refuse it whole
            out.append(f"[{kind} part omitted: this model reads text only]")
        else:
            raise ApiError(
                "invalid_request",
                f"{where}.content[{i}] has type {kind!r}; this model reads text parts only",
                param=f"{where}.content",
            )
    return "\n".join(out)


def _arguments(raw: str | dict[str, Any] | None, where: str) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        raise ApiError(
            "invalid_request",
            f"{where}.function.arguments is not valid JSON: {raw[:200]!r}",
            param=where,
        ) from None
    if not isinstance(value, dict):
        raise ApiError("invalid_request", f"{where}.function.arguments must be a JSON object")
    return value


def to_chat_request(body: ChatCompletionRequest) -> ChatRequest:
    if not body.messages:
        raise ApiError("invalid_request", "messages must not be empty", param="messages")
    if body.n not in (None, 1):
        raise ApiError("invalid_request", f"n = {body.n} is not supported; use n = 1", param="n")
    _check_range("temperature", body.temperature, 0.0, 2.0)
    _check_range("top_p", body.top_p, 0.0, 1.0, low_open=True)
    _check_range("top_logprobs", body.top_logprobs, 0, 20)
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise ApiError("invalid_request", f"max_tokens = {max_tokens} must be >= 1")
    if body.top_k is not None and body.top_k < 0:
        raise ApiError("invalid_request", f"top_k = {body.top_k} must be >= 0")
    messages = []
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        if m.role == "tool":
            messages.append(
                Message(
                    role="tool",
                    content=_text(m.content, where, lenient=True),
                    tool_call_id=m.tool_call_id,
                    name=m.name,
                )
            )
        elif m.role in _ROLES:
            calls = tuple(
                ToolCall(
                    id=c.id or f"call_{j}",
                    name=c.function.name,
                    arguments=_arguments(c.function.arguments, f"{where}.tool_calls[{j}]"),
                )
                for j, c in enumerate(m.tool_calls or ())
            )
            if calls and m.role != "assistant":
                raise ApiError(
                    "invalid_request", f"{where}: only assistant messages have tool_calls"
                )
            messages.append(
                Message(role=_ROLES[m.role], content=_text(m.content, where), tool_calls=calls)
            )
        else:
            raise ApiError(
                "invalid_request",
                f"{where}.role = {m.role!r} is not one of system, developer, user, assistant, tool",
                param=f"{where}.role",
            )
    tools = tuple(
        Tool(
            name=t.function.name,
            description=t.function.description or "",
            parameters=t.function.parameters or {},
        )
        for t in body.tools or ()
    )
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return ChatRequest(
        api="openai",
        messages=messages,
        tools=tools,
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=stop,
        seed=body.seed,
        parse_tools=body.tool_choice != "none",
        want_tokens=bool(body.logprobs) or bool(body.stream),
    )


def _check_range(name, value, low, high, *, low_open=False):
    if value is None:
        return
    if value < low or value > high or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ApiError("invalid_request", f"{name} = {value} is outside {bound}", param=name)


_FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}


def _logprob_entries(tokens, top: int | None) -> list[dict[str, Any]]:
    # The engine reports only the sampled token's log-prob: top_logprobs lists that one.
    out = []
    for text, lp in tokens:
        entry = {"token": text, "logprob": lp, "bytes": list(text.encode())}
        entry["top_logprobs"] = [dict(entry)] if top else []
        out.append(entry)
    return out


def _tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_json},
        }
        for c in calls
    ]


def _usage(r: ChatResult) -> dict[str, Any]:
    return {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.prompt_tokens + r.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": r.reused_tokens},
    }


def response(body: ChatCompletionRequest, r: ChatResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": r.content or None, "refusal": None}
    if r.tool_calls:
        message["tool_calls"] = _tool_calls(r.tool_calls)
    elif message["content"] is None:
        message["content"] = ""
    logprobs = None
    if body.logprobs:
        logprobs = {"content": _logprob_entries(r.tokens, body.top_logprobs), "refusal": None}
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": _FINISH[r.finish],
            }
        ],
        "usage": _usage(r),
        "system_fingerprint": None,
    }


class _Chunks:
    """Chat-completion chunks of one streamed answer (shared id, model, usage setting)."""

    def __init__(self, body: ChatCompletionRequest) -> None:
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.base = {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.model,
            "system_fingerprint": None,
        }

    def __call__(self, delta: dict[str, Any], finish: str | None = None, logprobs=None) -> bytes:
        data = {
            **self.base,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if self.include_usage:
            data["usage"] = None
        return sse.event(data)

    def ending(self, r: ChatResult) -> list[bytes]:
        """The tool calls (parsed once generation ended), the finish, usage, [DONE]."""
        out = []
        for i, call in enumerate(r.tool_calls):
            opening = {
                "index": i,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            out.append(self({"tool_calls": [opening]}))
            args = {"index": i, "function": {"arguments": call.arguments_json}}
            out.append(self({"tool_calls": [args]}))
        out.append(self({}, finish=_FINISH[r.finish]))
        if self.include_usage:
            out.append(sse.event({**self.base, "choices": [], "usage": _usage(r)}))
        out.append(sse.OPENAI_DONE)
        return out


def streams_live(body: ChatCompletionRequest) -> bool:
    """Live token streaming, except with ``logprobs``: those chunks are per token, sent
    once the generation has ended (see docs/proxy.md)."""
    return not body.logprobs


async def stream_live(
    body: ChatCompletionRequest, events: AsyncIterator[StreamEvent]
) -> AsyncIterator[bytes]:
    """Content deltas as the engine samples; tool calls and the finish at the end."""
    chunk = _Chunks(body)
    yield chunk({"role": "assistant", "content": ""})
    sent = ""
    async for event in events:
        if isinstance(event, TextDelta):
            sent += event.text
            yield chunk({"content": event.text})
        elif isinstance(event, ChatResult):
            rest = event.content[len(sent) :]
            if rest:
                yield chunk({"content": rest})
            for data in chunk.ending(event):
                yield data


async def stream(body: ChatCompletionRequest, r: ChatResult) -> AsyncIterator[bytes]:
    """A whole answer replayed as a stream (used with ``logprobs``)."""
    chunk = _Chunks(body)
    yield chunk({"role": "assistant", "content": ""})
    if r.content:
        if body.logprobs and not r.tool_calls and "".join(t for t, _ in r.tokens) == r.content:
            for tok in r.tokens:
                lp = {"content": _logprob_entries([tok], body.top_logprobs), "refusal": None}
                yield chunk({"content": tok[0]}, logprobs=lp)
        else:
            for piece in sse.pieces(r.content, () if r.tool_calls else r.tokens):
                yield chunk({"content": piece})
    for data in chunk.ending(r):
        yield data
