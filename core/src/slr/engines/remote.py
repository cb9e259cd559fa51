"""``HttpEngine``: the plumbing of an engine that talks to one HTTP inference server.

A subclass (``VllmEngine``, ``SglangEngine``) adds its protocol: ``generate``, ``stream``,
``update_weights`` and ``launch`` (the ``ServerProcess`` for its server). This class holds
what does not depend on the server: the URL (launched or attached), one HTTP client per
event loop, ``start`` (launch, wait for health, learn the context length, load the
tokenizer), ``health``, ``close``; and the module holds the replica set (``start_replicas``:
every configured server started at once, behind the ``LoadBalancer`` when there are several).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, cast

import httpx

from slr.contracts import EngineUnavailable
from slr.engines.balancer import LoadBalancer
from slr.engines.server import ServerProcess
from slr.errors import UsageError

if TYPE_CHECKING:
    from slr.contracts import Engine


class RemoteOptions(Protocol):
    """The options ``HttpEngine`` reads (``slr.engines.options.ServerOptions`` has them)."""

    @property
    def model(self) -> str: ...
    @property
    def tokenizer(self) -> str: ...
    @property
    def max_context(self) -> int: ...
    @property
    def startup_timeout_s(self) -> float: ...
    @property
    def request_timeout_s(self) -> float: ...


class HttpEngine:
    """The shared half of an ``slr.contracts.Engine`` over one HTTP server.

    ``await engine.start()`` launches the server (or checks an attached one) and learns
    its context length. ``label`` names the server in errors (``"vLLM"``).
    """

    label: ClassVar[str] = "HTTP"

    def __init__(
        self,
        config: Any,
        *,
        url: str | None = None,
        index: int = 0,
        tokenizer: Any | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.config = config
        self.index = index
        self.server: ServerProcess | None = None
        self._url = url.rstrip("/") if url else None
        self._tokenizer = tokenizer
        self._client = client
        self._client_loop: Any = asyncio.get_running_loop() if client is not None else None
        self._max_context: int = config.max_context
        self._version = 0
        self._closed = False
        # set while a weight swap runs: no generation starts until it is cleared
        self._updating: asyncio.Event | None = None

    def launch(self) -> ServerProcess:
        """Launch this replica's server (called by ``start`` when no URL was given)."""
        raise NotImplementedError

    def pick_max_context(self, cards: list[dict[str, Any]]) -> int | None:
        """The context length from ``/v1/models``' model cards, or None if it has none."""
        for card in cards:
            if card.get("max_model_len"):
                return int(card["max_model_len"])
        return None

    def no_max_context(self) -> UsageError:
        """The error when ``/v1/models`` reports no context length."""
        return UsageError(
            f"{self.url}/v1/models reports no max_model_len; set [engine] max_context"
        )

    @property
    def url(self) -> str:
        if self._url is None:
            raise EngineUnavailable(
                f"this {self.label} engine is not started; await engine.start()"
            )
        return self._url

    @property
    def client(self) -> httpx.AsyncClient:
        """An HTTP client for the running event loop (a client's pool belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.config.request_timeout_s, connect=10.0)
            )
            self._client_loop = loop
        return self._client

    async def start(self) -> Any:
        if self._url is None:
            self.server = self.launch()
            self._url = self.server.url
            await self.server.wait_ready(self.client, self.config.startup_timeout_s)
        if not self._max_context:
            self._max_context = await self._ask_max_context()
        if self._tokenizer is None:
            self._tokenizer = await asyncio.to_thread(load_tokenizer, self.config)
        return self

    async def _ask_max_context(self) -> int:
        try:
            response = await self.client.get(f"{self.url}/v1/models", timeout=30)
            response.raise_for_status()
            found = self.pick_max_context(list(response.json().get("data", [])))
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineUnavailable(f"could not read {self.url}/v1/models: {exc}") from exc
        if found is None:
            raise self.no_max_context()
        return found

    # -- the Engine protocol's shared half -------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def weights_version(self) -> int:
        return self._version

    async def _no_swap(self) -> None:
        """Wait until no weight swap is under way."""
        while self._updating is not None:
            await self._updating.wait()

    @contextlib.asynccontextmanager
    async def _swap(self) -> AsyncIterator[None]:
        """Hold new generations back (``_no_swap``) while the block swaps the weights."""
        self._updating = asyncio.Event()
        try:
            yield
        finally:
            event, self._updating = self._updating, None
            event.set()

    def _server_error(self, status: int, data: Any) -> EngineUnavailable:
        return EngineUnavailable(f"{self.label} server {self.url} failed (HTTP {status}): {data}")

    def _unanswered(self, exc: Exception) -> EngineUnavailable:
        return EngineUnavailable(
            f"{self.label} server {self.url} did not answer: {type(exc).__name__}: {exc}"
        )

    async def health(self) -> bool:
        if self._closed or (self.server is not None and not self.server.running):
            return False
        try:
            response = await self.client.get(f"{self.url}/health", timeout=10)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None


def load_tokenizer(config: RemoteOptions) -> Any:
    """The tokenizer the prompts are rendered with, from this machine only."""
    from transformers import AutoTokenizer

    source = config.tokenizer or config.model
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except OSError as exc:
        raise UsageError(
            f"cannot load the tokenizer from {source!r} on this machine: {exc}. Set [engine] "
            f"tokenizer to a local folder with the model's tokenizer files"
        ) from exc


E = TypeVar("E", bound=HttpEngine)


async def start_replicas(
    make: Callable[[str | None, int], E], *, urls: Sequence[str], replicas: int
) -> list[E]:
    """Start (or attach to) every configured server, concurrently: ``make(url, index)`` for
    each of ``urls``, or ``make(None, i)`` for ``replicas`` launched ones. If any fails to
    start, all are closed and the first error is raised."""
    targets: list[str | None] = list(urls) or [None] * replicas
    engines = [make(url, i) for i, url in enumerate(targets)]
    results = await asyncio.gather(*(e.start() for e in engines), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(e.close() for e in engines), return_exceptions=True)
        raise errors[0]
    return engines


def balanced(engines: list[E]) -> E | LoadBalancer:
    """One replica's engine itself, or a balancer over several (named by their URLs)."""
    if len(engines) == 1:
        return engines[0]
    # a subclass adds generate / stream / update_weights, the rest of the Engine contract
    replicas = cast("list[Engine]", engines)
    return LoadBalancer(replicas, names=[e.url for e in engines])


def run_sync(coro: Any) -> Any:
    """Run ``coro`` to completion from synchronous code, even inside a running loop (then
    on a helper thread with its own loop: construction blocks, like loading a model does;
    the engines make a fresh HTTP client per event loop, so nothing is tied to that one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
