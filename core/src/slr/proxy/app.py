"""The proxy's HTTP routes (litestar): both APIs per session, errors in each API's shape.

A client that goes away must not keep the engine busy: a streamed answer stops when its
connection closes (the stream's own disconnect listener), and every other call races its
work against the connection's ``http.disconnect`` so that a client that gave up, or a
scaffold killed at its timeout, cancels its generation at once instead of when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec
import structlog
from litestar import Litestar, Request, Response, get, head, post
from litestar.exceptions import HTTPException, InternalServerException
from litestar.response import Stream

from slr.proxy import anthropic, openai, sse
from slr.proxy.errors import CLOSES_CONNECTION, Api, ApiError, error_body, status_kind
from slr.proxy.session import Completer, SessionTable

log = structlog.get_logger()

_T = TypeVar("_T")

#: The status a call gets when its client left before the answer (nobody reads it; the
#: number is the one proxies conventionally log for it).
CLIENT_GONE = 499


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its work was cancelled."""


def _api_of(request: Request) -> Api:
    path = request.url.path
    if "/messages" in path:
        return "anthropic"
    if "/chat/completions" in path:
        return "openai"
    headers = request.headers
    return "anthropic" if "anthropic-version" in headers or "x-api-key" in headers else "openai"


def _token(request: Request) -> str | None:
    token = request.path_params.get("token")
    if token:
        return token
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _json(data: Any, status: int = 200, *, close: bool = False) -> Response:
    # An answer sent before the body was read whole ends the connection: what the client
    # still sends cannot be told from a next request.
    headers = {"connection": "close"} if close else None
    return Response(
        content=sse.json_bytes(data),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _error_response(request: Request, exc: Exception) -> Response:
    api = _api_of(request)
    if isinstance(exc, RecursionError):  # only input nests without bound: a bad request
        exc = _too_deep()
    if isinstance(exc, ClientGone):
        return _json(error_body(api, "invalid_request", str(exc)), CLIENT_GONE, close=True)
    if isinstance(exc, ApiError):
        return _json(exc.body(api), exc.status, close=exc.kind in CLOSES_CONNECTION)
    if isinstance(exc, HTTPException):
        kind = status_kind(exc.status_code)
        detail = exc.detail if exc.status_code != 404 else f"no route for {request.url.path}"
        status = 400 if kind == "invalid_request" else exc.status_code
        return _json(error_body(api, kind, str(detail)), status, close=kind in CLOSES_CONNECTION)
    log.exception("proxy.internal_error", path=request.url.path)
    return _json(error_body(api, "internal", f"internal proxy error: {exc!r}"), 500)


async def _disconnected(request: Request) -> None:
    """Return once the client has gone. Only after the body was read: from then on the
    server's next message is ``http.disconnect``."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _while_connected(request: Request, work: Awaitable[_T]) -> _T:
    """``work``'s result, or ``ClientGone`` once ``work`` was cancelled because the client
    disconnected first (the cancellation reaches the engine before this returns)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        gone.cancel()
    # let the cancellation reach the engine (or the work finish) before answering
    await asyncio.wait({task})
    if not task.cancelled():
        return task.result()
    log.info("proxy.client_gone", path=request.url.path)
    raise ClientGone("the client disconnected before its answer was ready; generation stopped")


async def _body(request: Request, timeout: float) -> bytes:
    try:
        async with asyncio.timeout(timeout):
            return await request.body()
    except TimeoutError:
        raise ApiError(
            "request_timeout",
            f"the request body did not arrive within {timeout:g}s ([proxy] body_timeout_s); "
            "send it whole, at once",
        ) from None
    except InternalServerException as exc:  # litestar's "client disconnected prematurely"
        raise ClientGone(str(exc.detail)) from None


async def _decode(request: Request, schema: type, limit: int, timeout: float):
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise ApiError("request_too_large", f"request body is {length} bytes; the limit is {limit}")
    body = await _body(request, timeout)
    if len(body) > limit:
        raise ApiError(
            "request_too_large", f"request body is {len(body)} bytes; the limit is {limit}"
        )
    try:
        return msgspec.json.decode(body, type=schema)
    except msgspec.ValidationError as exc:
        raise ApiError("invalid_request", f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ApiError("invalid_request", f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise _too_deep() from None


def _too_deep() -> ApiError:
    return ApiError(
        "invalid_request", "request body nests JSON too deeply; no API message needs that"
    )


def build_app(
    *,
    sessions: SessionTable,
    completer: Completer,
    model_names: Sequence[str],
    max_body_bytes: int,
    body_timeout_s: float = 60.0,
    open_health: bool = True,
) -> Litestar:
    """The routes over ``sessions`` (token -> session) and ``completer`` (one model call).

    ``model_names`` are the names a request may ask for (empty: any); request bodies above
    ``max_body_bytes``, or slower to arrive than ``body_timeout_s``, are refused. Every
    route but the health check needs a live session's token; with ``open_health`` false
    (a proxy reachable from other machines) the health check needs one too.
    """
    limit = max_body_bytes
    body_timeout = body_timeout_s
    names = tuple(model_names)

    def check_model(model: str) -> None:
        if names and model not in names:
            raise ApiError(
                "model_not_found",
                f"model {model!r} is not served here; available: {', '.join(names)}",
                param="model",
            )

    @head("/", status_code=200)
    async def root_head(request: Request) -> None:
        if not open_health:
            sessions.lookup(_token(request))
        return None

    @get(["/", "/health", "/healthz"])
    async def health(request: Request) -> Response:
        if not open_health:
            sessions.lookup(_token(request))
        return _json({"status": "ok", "sessions": len(sessions)})

    @get(["/v1/models", "/s/{token:str}/v1/models", "/s/{token:str}/models"])
    async def models(request: Request) -> Response:
        sessions.lookup(_token(request))
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "slr",
                "type": "model",
                "display_name": name,
                "created_at": "1970-01-01T00:00:00Z",
            }
            for name in names
        ]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return _json(
            {"object": "list", "data": data, "has_more": False, "first_id": first, "last_id": last}
        )

    async def complete(request: Request, api: Any, request_cls: type) -> Response:
        """One model call in either API: the two differ only in their wire format."""
        state = sessions.lookup(_token(request))
        body = await _decode(request, request_cls, limit, body_timeout)
        check_model(body.model)
        chat = api.to_chat_request(body)
        if body.stream and api.streams_live(body):
            events = completer.stream(state, chat)
            # Errors before the first token (a bad request, an engine that is down) are
            # plain error responses; the stream starts once the engine has a token.
            try:
                first = await _while_connected(request, anext(events))
            except ClientGone:
                await events.aclose()  # type: ignore[attr-defined]
                raise
            return _sse(_guarded(api.stream_live(body, _prepend(first, events)), request))
        result = await _while_connected(request, completer.complete(state, chat))
        if body.stream:
            return _sse(api.stream(body, result))
        return _json(api.response(body, result))

    @post(
        [
            "/v1/chat/completions",
            "/s/{token:str}/v1/chat/completions",
            "/s/{token:str}/chat/completions",
        ],
        status_code=200,
    )
    async def chat_completions(request: Request) -> Response:
        return await complete(request, openai, openai.ChatCompletionRequest)

    @post(["/v1/messages", "/s/{token:str}/v1/messages"], status_code=200)
    async def messages(request: Request) -> Response:
        return await complete(request, anthropic, anthropic.MessagesRequest)

    @post(["/v1/messages/count_tokens", "/s/{token:str}/v1/messages/count_tokens"], status_code=200)
    async def count_tokens(request: Request) -> Response:
        state = sessions.lookup(_token(request))
        body = await _decode(request, anthropic.CountTokensRequest, limit, body_timeout)
        check_model(body.model)
        msgs = anthropic.convert_messages(body.messages, body.system)
        n = completer.count(state, msgs, anthropic.convert_tools(body.tools))
        return _json({"input_tokens": n})

    handlers: list[Callable] = [root_head, health, models, chat_completions, messages, count_tokens]
    return Litestar(
        route_handlers=handlers,
        exception_handlers={Exception: _error_response},
        request_max_body_size=limit,
        debug=False,
        logging_config=None,
        openapi_config=None,
    )


async def _prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


async def _guarded(chunks: AsyncIterator[bytes], request: Request) -> AsyncIterator[bytes]:
    """A live stream whose later failure becomes an error event in the client's API (the
    HTTP status is already sent). A client that goes away closes it, which cancels the
    engine's generation through every layer below."""
    try:
        async for data in chunks:
            yield data
    except ApiError as exc:
        api = _api_of(request)
        yield sse.event(exc.body(api), "error" if api == "anthropic" else None)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def _sse(chunks) -> Stream:
    return Stream(
        chunks,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
