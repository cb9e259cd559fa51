"""The proxy: a litestar app served by uvicorn inside the rollout process.

Lifecycle. ``await proxy.start()`` binds a socket (port 0: an ephemeral one, known before
start returns) and serves it from a task on the *caller's* event loop, the same loop that
runs the trials and the engine's coroutines: the engine is never driven from two loops, and
nothing needs a lock across threads. ``await proxy.stop()`` ends it. Code without a loop of
its own (a CLI, synchronous tests) uses ``ProxyThread``, which runs the proxy, and so the
engine's coroutines, on a dedicated loop in a background thread.

Uvicorn's signal handling is switched off: the host process owns SIGINT / SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
import uvicorn
from attrs import field, frozen
from litestar import Litestar, Request, Response, get, head, post
from litestar.exceptions import HTTPException
from litestar.response import Stream

from slr.config import ProxySection
from slr.contracts import Endpoint, Engine, SamplingParams, TerminationReason, Trajectory
from slr.proxy import anthropic, openai, sse
from slr.proxy.accumulator import Accumulator
from slr.proxy.errors import Api, ApiError, error_body, status_kind
from slr.proxy.render import Renderer
from slr.proxy.session import Completer, SessionState
from slr.proxy.toolparse import get_tool_parser
from slr.runs import atomic_write

log = structlog.get_logger()


@frozen(kw_only=True)
class Session:
    """What a trial gets from ``open_session``: where its agent reaches the policy."""

    trial_id: str
    token: str
    base_url: str  # http://host:port/s/<token>
    _state: SessionState = field(repr=False, eq=False)

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    @property
    def termination(self) -> TerminationReason | None:
        """Set when the proxy ended the conversation (``context_overflow``)."""
        return self._state.termination

    def endpoint(self, protocol: str, *, model: str, host: str | None = None) -> Endpoint:
        """The ``Endpoint`` an adapter needs; ``host`` replaces the address the sandbox uses."""
        url = self.openai_base_url if protocol == "openai" else self.anthropic_base_url
        if host is not None:
            scheme, rest = url.split("://", 1)
            port_and_path = rest.split(":", 1)[1]
            url = f"{scheme}://{host}:{port_and_path}"
        return Endpoint(base_url=url, api_key=self.token, model=model)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


class Proxy:
    """Serves OpenAI and Anthropic APIs per session and records what the policy generated.

    ``sampling`` gives the defaults (and caps: ``max_tokens``) for every call; ``model_names``
    are the names the proxy answers to (any other name gets a not-found error).
    """

    def __init__(
        self,
        engine: Engine,
        config: ProxySection | None = None,
        *,
        sampling: SamplingParams | None = None,
        model_names: Sequence[str] | None = None,
    ) -> None:
        self.engine = engine
        self.config = config or ProxySection()
        parser = get_tool_parser(self.config.tool_parser)
        self.renderer = Renderer(engine.tokenizer, parser)
        self.completer = Completer(engine, self.renderer, parser, sampling or SamplingParams())
        self.model_names = tuple(model_names or self.config.model_names)
        self.sessions: dict[str, SessionState] = {}
        self.app = _build_app(self)
        self.host = self.config.host
        self.port: int | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task | None = None

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the proxy is not started; call `await proxy.start()` first")
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        if self._task is not None:
            return
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.config.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        ready = asyncio.create_task(self._server.ready.wait())
        done, _ = await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:
            ready.cancel()
            self._task.result()
            raise RuntimeError(f"the proxy could not start on {self.host}:{self.port}")
        log.info("proxy.started", url=self.url)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._server = self._task = None

    async def __aenter__(self) -> Proxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # -- sessions ---------------------------------------------------------------------------

    def open_session(self, trial_id: str) -> Session:
        token = "slr-" + secrets.token_urlsafe(18)
        acc = Accumulator(self.renderer, on_rewrite=self.config.on_history_rewrite)
        state = SessionState(trial_id=trial_id, token=token, accumulator=acc)
        self.sessions[token] = state
        return Session(
            trial_id=trial_id, token=token, base_url=f"{self.url}/s/{token}", state=state
        )

    def close_session(self, session: Session) -> Trajectory:
        """End the session (later calls are refused) and return what it recorded."""
        state = self.sessions.pop(session.token, None) or session._state
        state.closed = True
        return state.trajectory()

    def write_transcript(self, session: Session, folder: Path) -> Path:
        """Write ``<folder>/<trial_id>/proxy.json``: each call's decoded text, for people."""
        state = session._state
        path = Path(folder) / session.trial_id / "proxy.json"
        doc = {
            "trial_id": session.trial_id,
            "termination": state.termination,
            "segments": [
                {"index": s.index, "tokens": len(s.ids), "policy_tokens": sum(s.mask)}
                for s in state.accumulator.segments
            ],
            "calls": state.turns,
        }
        atomic_write(path, json.dumps(doc, indent=2, ensure_ascii=False, default=str))
        return path

    def _state(self, token: str | None, api: Api) -> SessionState:
        state = self.sessions.get(token or "")
        if state is None or state.closed:
            raise ApiError(
                "authentication",
                "no open session for this token: use the base URL or API key from "
                "open_session(); the session may have been closed",
            )
        return state

    def _check_model(self, model: str) -> None:
        if self.model_names and model not in self.model_names:
            raise ApiError(
                "model_not_found",
                f"model {model!r} is not served here; available: {', '.join(self.model_names)}",
                param="model",
            )


class ProxyThread:
    """Run a proxy on its own event loop in a daemon thread (for code without a loop)."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="slr-proxy", daemon=True)

    def __enter__(self) -> Proxy:
        self._thread.start()
        self.call(self.proxy.start())
        return self.proxy

    def call(self, coro) -> Any:
        """Run a coroutine on the proxy's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def __exit__(self, *exc: Any) -> None:
        self.call(self.proxy.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


# -- the app ------------------------------------------------------------------------------


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


def _json(data: Any, status: int = 200) -> Response:
    return Response(content=sse.json_bytes(data), status_code=status, media_type="application/json")


def _error_response(request: Request, exc: Exception) -> Response:
    api = _api_of(request)
    if isinstance(exc, ApiError):
        return _json(exc.body(api), exc.status)
    if isinstance(exc, HTTPException):
        kind = status_kind(exc.status_code)
        detail = exc.detail if exc.status_code != 404 else f"no route for {request.url.path}"
        status = 400 if kind == "invalid_request" else exc.status_code
        return _json(error_body(api, kind, str(detail)), status)
    log.exception("proxy.internal_error", path=request.url.path)
    return _json(error_body(api, "internal", f"internal proxy error: {exc!r}"), 500)


async def _decode(request: Request, schema: type, limit: int):
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise ApiError("request_too_large", f"request body is {length} bytes; the limit is {limit}")
    body = await request.body()
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


def _build_app(proxy: Proxy) -> Litestar:
    limit = proxy.config.max_body_bytes

    @head("/", status_code=200)
    async def root_head() -> None:
        return None

    @get(["/", "/health", "/healthz"])
    async def health() -> Response:
        return _json({"status": "ok", "sessions": len(proxy.sessions)})

    @get(["/v1/models", "/s/{token:str}/v1/models", "/s/{token:str}/models"])
    async def models(request: Request) -> Response:
        proxy._state(_token(request), _api_of(request))
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
            for name in proxy.model_names
        ]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return _json(
            {"object": "list", "data": data, "has_more": False, "first_id": first, "last_id": last}
        )

    @post(
        [
            "/v1/chat/completions",
            "/s/{token:str}/v1/chat/completions",
            "/s/{token:str}/chat/completions",
        ],
        status_code=200,
    )
    async def chat_completions(request: Request) -> Response:
        state = proxy._state(_token(request), "openai")
        body = await _decode(request, openai.ChatCompletionRequest, limit)
        proxy._check_model(body.model)
        result = await proxy.completer.complete(state, openai.to_chat_request(body))
        if body.stream:
            return _sse(openai.stream(body, result))
        return _json(openai.response(body, result))

    @post(["/v1/messages", "/s/{token:str}/v1/messages"], status_code=200)
    async def messages(request: Request) -> Response:
        state = proxy._state(_token(request), "anthropic")
        body = await _decode(request, anthropic.MessagesRequest, limit)
        proxy._check_model(body.model)
        result = await proxy.completer.complete(state, anthropic.to_chat_request(body))
        if body.stream:
            return _sse(anthropic.stream(body, result))
        return _json(anthropic.response(body, result))

    @post(["/v1/messages/count_tokens", "/s/{token:str}/v1/messages/count_tokens"], status_code=200)
    async def count_tokens(request: Request) -> Response:
        state = proxy._state(_token(request), "anthropic")
        body = await _decode(request, anthropic.CountTokensRequest, limit)
        proxy._check_model(body.model)
        msgs = anthropic.convert_messages(body.messages, body.system)
        n = proxy.completer.count(state, msgs, anthropic.convert_tools(body.tools))
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


def _sse(chunks) -> Stream:
    return Stream(
        chunks,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
