"""``VllmEngine``: one vLLM server (launched or attached) behind the Engine contract."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx
import structlog

from slr.balancer import LoadBalancer
from slr.contracts import (
    ContextOverflow,
    EngineUnavailable,
    Generation,
    GenerationChunk,
    SamplingParams,
    UpdateMode,
)
from slr.contracts.engine import check_update_mode
from slr.errors import UsageError
from slr_engine_vllm.config import VllmEngineConfig
from slr_engine_vllm.protocol import (
    ProtocolError,
    completion_request,
    error_for,
    parse_chunk,
    parse_completion,
)
from slr_engine_vllm.server import VllmServer
from slr_engine_vllm.weights import Transport, WeightSync

log = structlog.get_logger()


class VllmEngine:
    """Implements ``slr.contracts.Engine`` against one vLLM server.

    ``await engine.start()`` launches the server (or checks an attached one) and learns
    its context length; ``create_engine`` does that for the run. A transport error, a 5xx
    or a dead process raises ``EngineUnavailable`` (the balancer then fails over); a 4xx
    raises ``ValueError`` or ``ContextOverflow`` (the request itself was wrong).
    """

    def __init__(
        self,
        config: VllmEngineConfig,
        *,
        url: str | None = None,
        index: int = 0,
        tokenizer: Any | None = None,
        client: httpx.AsyncClient | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.config = config
        self.index = index
        self.server: VllmServer | None = None
        self._url = url.rstrip("/") if url else None
        self._tokenizer = tokenizer
        self._client = client
        self._client_loop: Any = asyncio.get_running_loop() if client is not None else None
        self._max_context = config.max_context
        self._version = 0
        self._closed = False
        self._updating: asyncio.Event | None = None
        self._weights = WeightSync(
            transport=transport, trainer_address=config.trainer_address or None
        )

    @property
    def url(self) -> str:
        if self._url is None:
            raise EngineUnavailable("this vLLM engine is not started; await engine.start()")
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

    async def start(self) -> VllmEngine:
        if self._url is None:
            self.server = VllmServer(self.config, index=self.index)
            self._url = self.server.url
            await self.server.wait_ready(self.client, self.config.startup_timeout_s)
        if not self._max_context:
            self._max_context = await self._ask_max_context()
        if self._tokenizer is None:
            self._tokenizer = await asyncio.to_thread(_load_tokenizer, self.config)
        return self

    async def _ask_max_context(self) -> int:
        try:
            response = await self.client.get(f"{self.url}/v1/models", timeout=30)
            response.raise_for_status()
            for model in response.json().get("data", []):
                if model.get("id") == self.config.served_model_name and model.get("max_model_len"):
                    return int(model["max_model_len"])
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineUnavailable(f"could not read {self.url}/v1/models: {exc}") from exc
        raise UsageError(
            f"{self.url} does not serve {self.config.served_model_name!r} with a max_model_len; "
            f"set [engine] served_model_name to what the server serves, or max_context"
        )

    # -- the Engine protocol --------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def weights_version(self) -> int:
        return self._version

    async def _request(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, stream: bool
    ) -> tuple[dict[str, Any], int]:
        """The completions body for a call, once no weight swap is under way, and the
        weights version it will run under. Refuses a closed engine or an oversized prompt."""
        if self._closed:
            raise EngineUnavailable(f"vLLM engine {self.index} is closed")
        if self._max_context and len(prompt_ids) >= self._max_context:
            raise ContextOverflow(len(prompt_ids), self._max_context)
        body = completion_request(
            prompt_ids,
            sampling,
            model=self.config.served_model_name,
            allow_truncated_logprobs=self.config.allow_truncated_logprobs,
        )
        if stream:
            body["stream"] = True
        while self._updating is not None:  # no generation starts during a weight swap
            await self._updating.wait()
        return body, self._version

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        body, version = await self._request(prompt_ids, sampling, stream=False)
        headers = {"X-Session-Id": session_id} if session_id else {}
        try:
            response = await self.client.post(
                f"{self.url}/v1/completions", json=body, headers=headers
            )
        except httpx.TransportError as exc:
            raise EngineUnavailable(
                f"vLLM server {self.url} did not answer: {type(exc).__name__}: {exc}"
            ) from exc
        data = _json(response)
        if response.status_code >= 500:
            raise EngineUnavailable(
                f"vLLM server {self.url} failed (HTTP {response.status_code}): {data}"
            )
        if response.status_code >= 400:
            raise error_for(
                response.status_code,
                data,
                prompt_tokens=len(prompt_ids),
                max_context=self._max_context,
            )
        try:
            return parse_completion(data, prompt_tokens=len(prompt_ids), weights_version=version)
        except ProtocolError as exc:
            raise EngineUnavailable(f"vLLM server {self.url}: {exc}") from exc

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        """The server's streaming completions (``stream: true``), chunk by chunk. Closing
        the stream closes the HTTP response, and vLLM aborts a request whose client left."""
        body, version = await self._request(prompt_ids, sampling, stream=True)
        headers = {"X-Session-Id": session_id} if session_id else {}
        n = len(prompt_ids)
        try:
            async with self.client.stream(
                "POST", f"{self.url}/v1/completions", json=body, headers=headers
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    data = _json(response)
                    if response.status_code >= 500:
                        raise EngineUnavailable(
                            f"vLLM server {self.url} failed (HTTP {response.status_code}): {data}"
                        )
                    raise error_for(
                        response.status_code, data, prompt_tokens=n, max_context=self._max_context
                    )
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = parse_chunk(
                        json.loads(payload), prompt_tokens=n, weights_version=version
                    )
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
        except httpx.TransportError as exc:
            raise EngineUnavailable(
                f"vLLM server {self.url} did not answer: {type(exc).__name__}: {exc}"
            ) from exc
        except (ProtocolError, json.JSONDecodeError) as exc:
            raise EngineUnavailable(f"vLLM server {self.url}: {exc}") from exc
        raise EngineUnavailable(f"vLLM server {self.url} ended the stream without a finish_reason")

    async def update_weights(
        self,
        state_dict: Mapping[str, Any],
        *,
        version: int | None = None,
        mode: UpdateMode = "drain",
    ) -> int:
        """Pause the server, stream the weights in, resume; see ``weights.WeightSync``."""
        check_update_mode(mode)
        if mode == "partial":
            raise NotImplementedError(
                "partial weight updates are not implemented for vLLM yet: they need vLLM's "
                "in-place pause (keep in-flight requests at a token boundary) or abort + "
                "resume of each request with its tokens so far, driven around /update_weights; "
                "use mode='drain'"
            )
        if self.config.weight_transfer == "none":
            raise UsageError(
                "this vLLM engine is configured with weight_transfer = 'none'; set it to "
                "'nccl' to push weights from the trainer"
            )
        self._updating = asyncio.Event()
        try:
            new_version = version if version is not None else self._version + 1
            await self._weights.push(state_dict, url=self.url, client=self.client)
            self._version = new_version
            return new_version
        finally:
            event, self._updating = self._updating, None
            event.set()

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


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:500]


def _load_tokenizer(config: VllmEngineConfig) -> Any:
    from transformers import AutoTokenizer

    source = config.tokenizer or config.model
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except OSError as exc:
        raise UsageError(
            f"cannot load the tokenizer from {source!r} on this machine: {exc}. Set [engine] "
            f"tokenizer to a local folder with the model's tokenizer files"
        ) from exc


async def start_engines(config: VllmEngineConfig) -> list[VllmEngine]:
    """Start (or attach to) every configured server, concurrently."""
    tokenizer = await asyncio.to_thread(_load_tokenizer, config)
    if config.urls:
        engines = [
            VllmEngine(config, url=u, index=i, tokenizer=tokenizer)
            for i, u in enumerate(config.urls)
        ]
    else:
        engines = [VllmEngine(config, index=i, tokenizer=tokenizer) for i in range(config.replicas)]
    results = await asyncio.gather(*(e.start() for e in engines), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(e.close() for e in engines), return_exceptions=True)
        raise errors[0]
    return engines


def create_engine(config: VllmEngineConfig | None = None) -> VllmEngine | LoadBalancer:
    """The registered factory: one server's engine, or a balancer over several."""
    config = config or VllmEngineConfig()
    engines = _run_sync(start_engines(config))
    if len(engines) == 1:
        return engines[0]
    return LoadBalancer(engines, names=[e.url for e in engines])


def _run_sync(coro: Any) -> Any:
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
