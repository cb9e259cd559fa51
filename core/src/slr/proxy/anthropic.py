"""Anthropic Messages: request schema, conversion, responses and the event stream.

Accepted and ignored (the policy cannot honour them, Claude Code and the SDK send them):
``thinking``, ``metadata``, ``output_config``, ``context_management``, ``service_tier``,
``cache_control`` on any block, ``anthropic-beta`` / ``anthropic-version`` headers,
``?beta=true``, ``thinking`` / ``redacted_thinking`` blocks in earlier assistant turns, and any
other unknown field. A ``role: "system"`` message inside ``messages`` is a system turn.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from slr.proxy import sse
from slr.proxy.errors import ApiError
from slr.proxy.messages import Message, Tool, ToolCall
from slr.proxy.session import ChatRequest, ChatResult, Started, StreamEvent, TextDelta


class RequestMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]]


class RequestTool(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[RequestMessage]
    max_tokens: int
    system: str | list[dict[str, Any]] | None = None
    tools: list[RequestTool] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[RequestMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[RequestTool] | None = None


_IGNORED_BLOCKS = {"thinking", "redacted_thinking"}


def _block_text(block: dict[str, Any], where: str) -> str:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return block["text"]
    raise ApiError(
        "invalid_request",
        f"{where} has type {kind!r}; this model reads text blocks only",
        param=where,
    )


def _joined(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(
        _block_text(b, f"{where}[{i}]")
        for i, b in enumerate(content)
        if b.get("type") not in _IGNORED_BLOCKS
    )


def _system(system: str | list[dict[str, Any]] | None) -> list[Message]:
    text = _joined(system, "system")
    return [Message(role="system", content=text)] if system is not None else []


def convert_messages(raw: list[RequestMessage], system) -> list[Message]:
    if not raw:
        raise ApiError("invalid_request", "messages: at least one message is required")
    out = _system(system)
    for i, m in enumerate(raw):
        where = f"messages[{i}].content"
        if m.role == "system":
            out.append(Message(role="system", content=_joined(m.content, where)))
            continue
        if m.role not in ("user", "assistant"):
            raise ApiError(
                "invalid_request", f"messages[{i}].role = {m.role!r}: expected user or assistant"
            )
        if isinstance(m.content, str):
            out.append(Message(role=m.role, content=m.content))
            continue
        texts: list[str] = []
        calls: list[ToolCall] = []
        for j, block in enumerate(m.content):
            kind = block.get("type")
            if kind in _IGNORED_BLOCKS:
                continue
            if kind == "tool_use" and m.role == "assistant":
                calls.append(_tool_use(block, f"{where}[{j}]"))
            elif kind == "tool_result" and m.role == "user":
                out.append(_tool_result(block, f"{where}[{j}]"))
            else:
                texts.append(_block_text(block, f"{where}[{j}]"))
        if m.role == "assistant":
            out.append(Message(role="assistant", content="\n".join(texts), tool_calls=calls))
        elif texts or not any(b.get("type") == "tool_result" for b in m.content):
            out.append(Message(role="user", content="\n".join(texts)))
    return out


def _tool_use(block: dict[str, Any], where: str) -> ToolCall:
    name, args = block.get("name"), block.get("input", {})
    if not isinstance(name, str) or not isinstance(args, dict):
        raise ApiError(
            "invalid_request", f"{where}: tool_use needs a string name and an object input"
        )
    return ToolCall(id=str(block.get("id", "")), name=name, arguments=args)


def _tool_result(block: dict[str, Any], where: str) -> Message:
    content = block.get("content", "")
    if isinstance(content, list):
        # A tool's output is the harness's, not the agent author's: never refuse it whole.
        text = "\n".join(
            b["text"]
            if b.get("type") == "text" and isinstance(b.get("text"), str)
            else f"[{b.get('type')} block omitted: this model reads text only]"
            for b in content
        )
    elif isinstance(content, str):
        text = content
    else:
        raise ApiError("invalid_request", f"{where}.content must be a string or a list of blocks")
    if block.get("is_error"):
        text = f"Error: {text}"
    return Message(role="tool", content=text, tool_call_id=str(block.get("tool_use_id", "")))


def convert_tools(tools: list[RequestTool] | None) -> list[Tool]:
    return [
        Tool(name=t.name, description=t.description or "", parameters=t.input_schema or {})
        for t in tools or ()
    ]


def to_chat_request(body: MessagesRequest) -> ChatRequest:
    if body.max_tokens < 1:
        raise ApiError("invalid_request", f"max_tokens: {body.max_tokens} must be >= 1")
    for name, value, high in (("temperature", body.temperature, 1.0), ("top_p", body.top_p, 1.0)):
        if value is not None and not 0.0 <= value <= high:
            raise ApiError("invalid_request", f"{name}: {value} is outside [0, {high}]")
    if body.top_k is not None and body.top_k < 0:
        raise ApiError("invalid_request", f"top_k: {body.top_k} must be >= 0")
    choice = (body.tool_choice or {}).get("type")
    return ChatRequest(
        api="anthropic",
        messages=convert_messages(body.messages, body.system),
        tools=convert_tools(body.tools),
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p or None,
        top_k=body.top_k,
        stop=tuple(body.stop_sequences or ()),
        parse_tools=choice != "none",
        want_tokens=bool(body.stream),
    )


_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _stop_reason(r: ChatResult) -> str:
    return "stop_sequence" if r.finish == "stop_sequence" else _STOP[r.finish]


def _blocks(r: ChatResult) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if r.content or not r.tool_calls:
        blocks.append({"type": "text", "text": r.content})
    for c in r.tool_calls:
        blocks.append({"type": "tool_use", "id": _tool_id(c), "name": c.name, "input": c.arguments})
    return blocks


def _tool_id(call: ToolCall) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def _usage(r: ChatResult, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": r.prompt_tokens - r.reused_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": r.reused_tokens,
        "output_tokens": output_tokens,
    }


def response(body: MessagesRequest, r: ChatResult) -> dict[str, Any]:
    return {
        "id": "msg_" + uuid.uuid4().hex,
        "type": "message",
        "role": "assistant",
        "model": body.model,
        "content": _blocks(r),
        "stop_reason": _stop_reason(r),
        "stop_sequence": r.stop_sequence,
        "usage": _usage(r, r.completion_tokens),
    }


async def stream(body: MessagesRequest, r: ChatResult) -> AsyncIterator[bytes]:
    start = {
        **response(body, r),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(r, 0),
    }
    yield sse.event({"type": "message_start", "message": start}, "message_start")
    for index, block in enumerate(_blocks(r)):
        if block["type"] == "text":
            opening = {"type": "text", "text": ""}
            yield sse.event(
                {"type": "content_block_start", "index": index, "content_block": opening},
                "content_block_start",
            )
            for piece in sse.pieces(block["text"], () if r.tool_calls else r.tokens):
                delta = {"type": "text_delta", "text": piece}
                yield sse.event(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
        else:
            opening = {**block, "input": {}}
            yield sse.event(
                {"type": "content_block_start", "index": index, "content_block": opening},
                "content_block_start",
            )
            delta = {
                "type": "input_json_delta",
                "partial_json": sse.json_bytes(block["input"]).decode(),
            }
            yield sse.event(
                {"type": "content_block_delta", "index": index, "delta": delta},
                "content_block_delta",
            )
        yield sse.event({"type": "content_block_stop", "index": index}, "content_block_stop")
    for event in _message_end(r):
        yield event


def _message_end(r: ChatResult) -> list[bytes]:
    """The events that close a streamed message: why it stopped, its usage, the stop."""
    delta = {"stop_reason": _stop_reason(r), "stop_sequence": r.stop_sequence}
    return [
        sse.event(
            {
                "type": "message_delta",
                "delta": delta,
                "usage": {"output_tokens": r.completion_tokens},
            },
            "message_delta",
        ),
        sse.event({"type": "message_stop"}, "message_stop"),
    ]


def streams_live(body: MessagesRequest) -> bool:
    return True


async def stream_live(
    body: MessagesRequest, events: AsyncIterator[StreamEvent]
) -> AsyncIterator[bytes]:
    """Text deltas as the engine samples; tool_use blocks once parsed at the end."""
    text_open = False
    sent = ""

    def open_text() -> bytes:
        opening = {"type": "text", "text": ""}
        return sse.event(
            {"type": "content_block_start", "index": 0, "content_block": opening},
            "content_block_start",
        )

    def text_delta(text: str) -> bytes:
        delta = {"type": "text_delta", "text": text}
        return sse.event(
            {"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"
        )

    async for event in events:
        if isinstance(event, Started):
            start = {
                "id": "msg_" + uuid.uuid4().hex,
                "type": "message",
                "role": "assistant",
                "model": body.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": event.prompt_tokens - event.reused_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": event.reused_tokens,
                    "output_tokens": 0,
                },
            }
            yield sse.event({"type": "message_start", "message": start}, "message_start")
        elif isinstance(event, TextDelta):
            if not text_open:
                text_open = True
                yield open_text()
            sent += event.text
            yield text_delta(event.text)
        elif isinstance(event, ChatResult):
            r = event
            rest = r.content[len(sent) :]
            if not text_open and (rest or not r.tool_calls):
                text_open = True
                yield open_text()
            if rest:
                yield text_delta(rest)
            index = 0
            if text_open:
                yield sse.event({"type": "content_block_stop", "index": 0}, "content_block_stop")
                index = 1
            for call in r.tool_calls:
                block = {"type": "tool_use", "id": _tool_id(call), "name": call.name, "input": {}}
                yield sse.event(
                    {"type": "content_block_start", "index": index, "content_block": block},
                    "content_block_start",
                )
                delta = {
                    "type": "input_json_delta",
                    "partial_json": sse.json_bytes(call.arguments).decode(),
                }
                yield sse.event(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
                yield sse.event(
                    {"type": "content_block_stop", "index": index}, "content_block_stop"
                )
                index += 1
            for event in _message_end(r):
                yield event
