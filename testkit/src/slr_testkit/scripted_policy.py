"""``ScriptedPolicyStub``: an OpenAI + Anthropic endpoint that answers from a script.

It stands in for the proxy and the model in the adapter conformance suite, where what is
under test is the adapter (does the scaffold reach this endpoint, with this key and model,
run the action it is given, exit, leave its logs) and a real model would make the answer
a matter of luck. The end-to-end tests use the real proxy and a real engine instead.

Each reply is a ``Reply``: text, tool calls, or both. Replies are served in order; after
the script runs out the last one repeats. Both APIs are served, streaming and not:
``POST /v1/chat/completions`` and ``POST /v1/messages`` (plus ``GET /v1/models``).
Every request is recorded (path, headers, body) in ``requests``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from attrs import field, frozen


@frozen(kw_only=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@frozen(kw_only=True)
class Reply:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = field(default=(), converter=tuple)


@frozen(kw_only=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    #: ``time.monotonic()`` when the request arrived (how long a scaffold took to start).
    at: float = field(factory=time.monotonic)


class ScriptedPolicyStub:
    """Serve ``script`` on ``host:port`` (0: a free port) until ``close()``.

    ``mode`` changes the whole endpoint's behaviour: ``"script"`` (default), ``"hang"``
    (accept requests, never answer: a model that never returns), ``"unauthorized"`` (401 to
    every model call).
    """

    def __init__(
        self, script: Sequence[Reply] = (Reply(text="done"),), *, host: str = "127.0.0.1"
    ) -> None:
        self.script = list(script)
        self.mode = "script"
        self.requests: list[Recorded] = []
        #: Called (on the serving thread) as each model call arrives, before it is answered.
        self.on_model_call: Callable[[], None] | None = None
        self._served = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        stub = self

        class Handler(_Handler):
            owner = stub

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """Root URL; OpenAI clients add ``/v1``."""
        return f"http://127.0.0.1:{self.port}"

    def model_calls(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.split("?")[0].endswith(_MODEL_PATHS)]

    def reset(self, script: Sequence[Reply] | None = None, *, mode: str = "script") -> None:
        with self._lock:
            if script is not None:
                self.script = list(script)
            self.mode = mode
            self.requests.clear()
            self._served = 0
            self._release.set()
            self._release = threading.Event()

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def _next(self) -> Reply:
        with self._lock:
            reply = self.script[min(self._served, len(self.script) - 1)]
            self._served += 1
            return reply


_MODEL_PATHS = ("/chat/completions", "/messages")


class _Handler(BaseHTTPRequestHandler):
    owner: ScriptedPolicyStub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _record(self, body: dict[str, Any]) -> None:
        self.owner.requests.append(
            Recorded(
                method=self.command,
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
        )

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (killed on timeout)

    def do_HEAD(self) -> None:
        self._record({})
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._record({})
        self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"_raw": raw.decode(errors="replace")}
        self._record(body)
        path = self.path.split("?")[0]
        if not path.endswith(_MODEL_PATHS):
            if path.endswith("/count_tokens"):
                return self._send(200, {"input_tokens": 100})
            return self._send(404, {"error": {"message": f"no route {path}"}})
        if self.owner.on_model_call is not None:
            self.owner.on_model_call()
        if self.owner.mode == "hang":
            self.owner._release.wait()
            return self._send(503, {"error": {"message": "released"}})
        if self.owner.mode == "unauthorized":
            return self._send(
                401,
                {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}},
            )
        reply = self.owner._next()
        model = body.get("model", "scripted")
        stream = bool(body.get("stream"))
        if path.endswith("/messages"):
            if stream:
                return self._sse(_anthropic_events(reply, model))
            return self._send(200, _anthropic_message(reply, model))
        if stream:
            return self._sse(_openai_chunks(reply, model, body), done=True)
        return self._send(200, _openai_completion(reply, model))

    def _sse(self, events: Sequence[tuple[str | None, dict]], done: bool = False) -> None:
        out = []
        for name, data in events:
            if name:
                out.append(f"event: {name}\n")
            out.append(f"data: {json.dumps(data)}\n\n")
        if done:
            out.append("data: [DONE]\n\n")
        self._send(200, "".join(out).encode(), "text/event-stream")


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


# -- OpenAI -------------------------------------------------------------------------------


def _openai_tool_calls(reply: Reply) -> list[dict]:
    return [
        {
            "id": _id("call_"),
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in reply.tool_calls
    ]


def _usage() -> dict:
    return {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}


def _openai_completion(reply: Reply, model: str) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = _openai_tool_calls(reply)
    return {
        "id": _id("chatcmpl-"),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            }
        ],
        "usage": _usage(),
    }


def _openai_chunks(reply: Reply, model: str, body: dict) -> list[tuple[None, dict]]:
    base = {"id": _id("chatcmpl-"), "object": "chat.completion.chunk", "created": 0, "model": model}

    def chunk(delta: dict, finish: str | None = None) -> tuple[None, dict]:
        return None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": ""})]
    if reply.text:
        events.append(chunk({"content": reply.text}))
    for i, call in enumerate(_openai_tool_calls(reply)):
        events.append(chunk({"tool_calls": [{"index": i, **call}]}))
    events.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {**base, "choices": [], "usage": _usage()}))
    return events


# -- Anthropic ----------------------------------------------------------------------------


def _anthropic_blocks(reply: Reply) -> list[dict]:
    blocks: list[dict] = []
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    for call in reply.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": _id("toolu_"), "name": call.name, "input": call.arguments}
        )
    return blocks


def _anthropic_message(reply: Reply, model: str) -> dict:
    return {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _anthropic_blocks(reply),
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 10},
    }


def _anthropic_events(reply: Reply, model: str) -> list[tuple[str, dict]]:
    msg = _anthropic_message(reply, model)
    start = {
        **msg,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 100, "output_tokens": 1},
    }
    events: list[tuple[str, dict]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for i, block in enumerate(msg["content"]):
        if block["type"] == "text":
            first, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        else:
            first = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": i, "content_block": first}),
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": i}),
        ]  # fmt: skip
    events += [
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                           "usage": {"output_tokens": 10}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return events
