"""The proxy: a litestar app served by uvicorn inside the rollout process.

Lifecycle. ``await proxy.start()`` binds a socket (port 0: an ephemeral one, known before
start returns) and serves it from a task on the *caller's* event loop, the same loop that
runs the trials and the engine's coroutines: the engine is never driven from two loops, and
nothing needs a lock across threads. ``await proxy.stop()`` ends it. Code without a loop of
its own (a CLI, synchronous tests) uses ``ProxyThread``, which runs the proxy, and so the
engine's coroutines, on a dedicated loop in a background thread.

Uvicorn's signal handling is switched off: the host process owns SIGINT / SIGTERM.

Slow clients are cut off: a request's line and headers must arrive within
``header_timeout_s`` of its first byte (uvicorn has no such limit of its own, and its
keep-alive timer restarts on every byte), its body within ``body_timeout_s`` (``app``).
Slow readers too: a client that leaves its answer unread for ``write_timeout_s`` while the
answer fills the connection's write buffer is cut off, and the cut reaches the app as a
disconnect, so its generation is cancelled like any other gone client's (uvicorn would
otherwise wait on the buffer to drain for ever, the generation held with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import structlog
import uvicorn
from attrs import field, frozen
from uvicorn.protocols.http.h11_impl import H11Protocol

from slr.config import ProxySection
from slr.contracts import (
    Endpoint,
    Engine,
    SamplingParams,
    SessionPinning,
    TerminationReason,
    Trajectory,
)
from slr.errors import UsageError
from slr.proxy.accumulator import Accumulator
from slr.proxy.app import build_app
from slr.proxy.render import Renderer
from slr.proxy.session import Completer, SessionState, SessionTable, new_token
from slr.proxy.toolparse import get_tool_parser
from slr.proxy.transport import HeadWithBody
from slr.rollout.costs import ModelClock
from slr.run.directory import atomic_write

log = structlog.get_logger()

#: The send buffer of each connection (see ``Proxy.start``).
SEND_BUFFER_BYTES = 64 * 1024

#: A closed session's transcript, ``<trials folder>/<trial_id>/proxy.json``.
TRANSCRIPT = "proxy.json"


@frozen(kw_only=True)
class Session:
    """What a trial gets from ``open_session``: where its agent reaches the policy."""

    trial_id: str
    token: str
    base_url: str  # http://host:port/s/<token>
    _state: SessionState = field(repr=False, eq=False, alias="state")

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    @property
    def engine_id(self) -> str:
        """What the engine knows this session by (its ``session_id``): not the token."""
        return self._state.engine_id

    @property
    def clock(self) -> ModelClock:
        """The session's model time (``slr.rollout.costs``): first call, time waiting on the engine."""
        return self._state.clock

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


_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


class _Deadlines(asyncio.Protocol):
    """Mixed into uvicorn's HTTP/1.1 protocol (httptools' or h11's, ``http_protocol``): a
    deadline for each request's line and headers, and one for a paused write.

    The header clock starts when a connection opens and when the first byte of a next
    request arrives; a request whose headers are not complete by then gets a bare 408 and
    the connection is closed. Nothing is handed to the app, so no session ever sees it.

    Each response's head is sent together with its body (``slr.proxy.transport``).

    The write clock runs while the transport has paused writing (its buffer above the high
    water mark: the client is not reading). If the client has not read enough to resume it
    by ``write_timeout``, the connection is aborted; uvicorn then tells the app the client
    disconnected.
    """

    header_timeout: float = 10.0
    write_timeout: float = 30.0
    # What both uvicorn protocols have, for the type checker.
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: Any) -> None:
        # A response's head goes out with its body: one send, one wake-up of the client.
        super().connection_made(cast(asyncio.Transport, HeadWithBody(transport, self.loop)))
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._arm()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._reader_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _reader_stalled(self) -> None:
        self._write_timer = None
        if self.transport.is_closing():
            return
        log.info("proxy.slow_reader_cut_off", write_timeout_s=self.write_timeout)
        self.transport.abort()  # buffered bytes dropped; connection_lost follows

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()
        super().data_received(data)
        if self._header_timer is not None and self.cycle is not self._armed_for:
            self._disarm()  # the request's headers are in: the app has it now

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._armed_for = self.cycle
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.cycle is not self._armed_for or self.transport.is_closing():
            return
        text = f"request headers did not arrive within {self.header_timeout:g}s\n".encode()
        self.transport.write(_REQUEST_TIMEOUT % (len(text), text))
        self.transport.close()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def http_protocol(
    parser: str = "auto", *, header_timeout: float = 10.0, write_timeout: float = 30.0
) -> type[_Deadlines]:
    """The proxy's HTTP/1.1 protocol class for uvicorn: ``parser`` ("httptools", "h11", or
    "auto": httptools when it imports) with the proxy's deadlines (``_Deadlines``)."""
    base: type[asyncio.Protocol] = H11Protocol
    if parser in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        except ImportError:
            if parser == "httptools":
                raise UsageError(
                    "proxy.http_parser = 'httptools' but httptools is not installed; "
                    "pip install httptools, or set proxy.http_parser = 'h11'"
                ) from None
        else:
            base = HttpToolsProtocol
    return type(
        "ProxyHttpProtocol",
        (_Deadlines, base),
        {"header_timeout": header_timeout, "write_timeout": write_timeout},
    )


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
        self.completer = Completer(
            engine,
            self.renderer,
            parser,
            sampling or SamplingParams(),
            honor_client_sampling=self.config.client_sampling == "honor",
        )
        self.model_names = tuple(model_names or self.config.model_names)
        self.sessions = SessionTable()
        self.app = build_app(
            sessions=self.sessions,
            completer=self.completer,
            model_names=self.model_names,
            max_body_bytes=self.config.max_body_bytes,
            body_timeout_s=self.config.body_timeout_s,
            open_health=is_loopback(self.config.host),
        )
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
        # Accepted sockets inherit this: without it a response written in two parts (head,
        # body) waits ~40 ms for the client's delayed ACK (Nagle), on every call.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A fixed send buffer (the kernel doubles it) instead of one autotuned up to MBs: an
        # answer streams at tokens per second, and a client that stops reading then pins
        # little memory and meets the write timeout after ~200 KB, not after megabytes.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        sock.bind((self.host, self.config.port))
        self.port = sock.getsockname()[1]
        # log_config=None: uvicorn's records go to the root logger, hence through slr.log,
        # instead of the handlers its default config would install
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=30,
            http=http_protocol(
                self.config.http_parser,
                header_timeout=self.config.header_timeout_s,
                write_timeout=self.config.write_timeout_s,
            ),
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
        token = new_token()
        acc = Accumulator(self.renderer, on_rewrite=self.config.on_history_rewrite)
        state = SessionState(trial_id=trial_id, token=token, accumulator=acc)
        self.sessions.add(state)
        return Session(
            trial_id=trial_id, token=token, base_url=f"{self.url}/s/{token}", state=state
        )

    def close_session(self, session: Session) -> Trajectory:
        """End the session and return what it recorded. Its token is dead from now on:
        later calls are refused, and calls in flight are cancelled (their generation stops
        at the engine's next token) and not recorded."""
        state = self.sessions.pop(session.token) or session._state
        state.close()
        # An engine that pins sessions (the load balancer) lets go of this one.
        if isinstance(self.engine, SessionPinning):
            self.engine.forget(state.engine_id)
        return state.trajectory()

    def transcript(self, session: Session) -> dict[str, Any]:
        """The session's readable transcript (each call's decoded text, for people)."""
        state = session._state
        return {
            "trial_id": session.trial_id,
            "termination": state.termination,
            "segments": [
                {"index": s.index, "tokens": len(s.ids), "policy_tokens": sum(s.mask)}
                for s in state.accumulator.segments
            ],
            "calls": state.turns,
            "messages": [m.as_openai() for m in state.conversation],
            "tools": [t.as_openai() for t in state.tools],
        }

    def write_transcript(self, session: Session, folder: Path) -> Path:
        """Write the session's transcript to ``<folder>/<trial_id>/proxy.json``."""
        return write_transcript(folder, self.transcript(session))


def write_transcript(folder: Path, transcript: Mapping[str, Any]) -> Path:
    """``<folder>/<trial_id>/proxy.json``: the one place a transcript's file is named and
    written (by the proxy's own process, or by the coordinator for a remote worker's)."""
    path = Path(folder) / str(transcript["trial_id"]) / TRANSCRIPT
    atomic_write(path, json.dumps(transcript, indent=2, ensure_ascii=False, default=str))
    return path


class ProxySessions:
    """The proxy as ``slr.rollout.trial.SessionFactory``: one session per trial.

    ``protocol`` is the agent's API (``AgentAdapter.protocol``), which picks the base URL;
    ``model`` is the name the agent sends. With ``transcripts`` (the run directory's
    ``trials/`` folder) each closed session leaves its ``<trial_id>/proxy.json``. The handle
    is the ``Session``: ``handle.termination`` says whether the proxy ended the conversation.
    """

    def __init__(
        self,
        proxy: Proxy,
        *,
        protocol: str,
        model: str | None = None,
        transcripts: Path | None = None,
        keep_transcripts: bool = False,
    ) -> None:
        self.proxy = proxy
        self.protocol = protocol
        self.model = model or (proxy.model_names[0] if proxy.model_names else "policy")
        self.transcripts = transcripts
        # a remote rollout worker writes nothing: it keeps each transcript for its caller
        self.keep_transcripts = keep_transcripts
        self._kept: dict[str, dict[str, Any]] = {}

    async def open(self, trial_id: str) -> tuple[Endpoint, Session]:
        session = self.proxy.open_session(trial_id)
        return session.endpoint(self.protocol, model=self.model), session

    def clock(self, handle: Session) -> ModelClock:
        """The session's ``ModelClock``, for the trial's cost accounting."""
        return handle.clock

    async def close(self, handle: Session) -> Trajectory:
        trajectory = self.proxy.close_session(handle)
        if self.keep_transcripts:
            self._kept[handle.trial_id] = self.proxy.transcript(handle)
        elif self.transcripts is not None:
            self.proxy.write_transcript(handle, self.transcripts)
        return trajectory

    def pop_transcript(self, trial_id: str) -> dict[str, Any] | None:
        """The kept transcript of a closed session (``keep_transcripts``), handed over once."""
        return self._kept.pop(trial_id, None)


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
