"""``SglangEngine``: one SGLang server (launched or attached) behind the Engine contract.

Every generation is a stream of ``/generate`` requests with our own ``rid``: normally
one; when a ``"partial"`` weight update arrives, each in-flight request is aborted by
its rid (``/abort_request``) at the token the server had reached, the new weights are
loaded, and the generation continues as a new request whose prompt is the original
prompt plus the tokens so far, under the new weights (the server recomputes their KV).
Each token records the version of the request that sampled it.

A LoRA update loads an adapter instead of new base weights (``adapters.Adapters``), with
the same drain / partial handling; every request after it names the adapter.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import structlog

from slr.contracts import (
    ContextOverflow,
    EngineUnavailable,
    Generation,
    GenerationChunk,
    SamplingParams,
    UpdateMode,
    collect,
)
from slr.contracts.engine import check_update_mode
from slr.contracts.weights import is_lora
from slr.engines.balancer import LoadBalancer
from slr.engines.protocol import response_json, sse_data
from slr.engines.remote import (
    HttpEngine,
    balanced,
    load_tokenizer,
    run_sync,
    start_replicas,
)
from slr.engines.server import ServerProcess
from slr.errors import UsageError
from slr_engine_sglang.adapters import Adapters
from slr_engine_sglang.config import SglangEngineConfig
from slr_engine_sglang.protocol import (
    ProtocolError,
    check_sampling,
    context_overflow,
    error_for,
    generate_request,
    read_output,
)
from slr_engine_sglang.server import find_python, launch_server
from slr_engine_sglang.transfer import Server, transfer_for
from slr_engine_sglang.weights import WeightFolders

log = structlog.get_logger()


class SglangEngine(HttpEngine):
    """Implements ``slr.contracts.Engine`` against one SGLang server.

    ``await engine.start()`` launches the server (or checks an attached one) and learns
    its context length; ``create_engine`` does that for the run. A transport error, a 5xx
    or a dead process raises ``EngineUnavailable`` (the balancer then fails over); a 4xx
    raises ``ValueError`` or ``ContextOverflow`` (the request itself was wrong).
    """

    label = "SGLang"
    config: SglangEngineConfig

    def __init__(
        self,
        config: SglangEngineConfig,
        *,
        url: str | None = None,
        index: int = 0,
        tokenizer: Any | None = None,
        client: httpx.AsyncClient | None = None,
        weights: WeightFolders | None = None,
    ) -> None:
        super().__init__(config, url=url, index=index, tokenizer=tokenizer, client=client)
        self._experts_per_token = config.experts_per_token
        self._inflight: dict[str, asyncio.Event] = {}  # rid -> set when its request ended
        self._preempted: set[str] = set()  # rids aborted by a partial update, to resume
        folders = weights or weight_folders(config)
        self._transfer = transfer_for(config, index=index, folders=folders)
        self._adapters = Adapters(config, folders=folders, index=index)

    def launch(self) -> ServerProcess:
        return launch_server(self.config, index=self.index)

    async def start(self) -> SglangEngine:
        await super().start()
        if self.config.return_routed_experts and not self._experts_per_token:
            self._experts_per_token = _experts_per_token(self.config)
        return self

    # -- the Engine protocol --------------------------------------------------------------

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        return await collect(self.stream(prompt_ids, sampling, session_id=session_id))

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        """The server's streamed tokens, chunk by chunk; across a partial weight update the
        generation continues as a new request (see the module docstring)."""
        if self._closed:
            raise EngineUnavailable(f"SGLang engine {self.index} is closed")
        prompt = [int(t) for t in prompt_ids]
        if self._max_context and len(prompt) >= self._max_context:
            raise ContextOverflow(len(prompt), self._max_context)
        check_sampling(sampling, allow_truncated_logprobs=self.config.allow_truncated_logprobs)
        generated: list[int] = []
        routing: list[Any] = []
        while True:
            await self._no_swap()
            context = prompt + generated
            room = sampling.max_tokens - len(generated)
            if self._max_context:
                room = min(room, self._max_context - len(context) - 1)
            if room <= 0:  # the context is full (SGLang refuses max_new_tokens = 0 rooms)
                yield GenerationChunk(finish_reason="length", prompt_tokens=len(prompt))
                return
            rid = f"slr-{uuid.uuid4().hex}"
            body = generate_request(
                context,
                sampling,
                rid=rid,
                max_new_tokens=room,
                stream=True,
                return_routed_experts=self.config.return_routed_experts,
                lora_path=self._adapters.current,
            )
            version = self._version
            ended = self._inflight[rid] = asyncio.Event()
            finish = None
            try:
                async for piece in self._request(body, rid, prompt_tokens=len(context)):
                    generated += piece.token_ids
                    routed = None
                    if piece.routed_experts is not None:
                        # earlier positions keep the routing of the pass that first ran them
                        routed = piece.routed_experts[len(routing) :]
                        routing += routed
                    finish = piece.finish_reason
                    resume = finish == "abort" and rid in self._preempted
                    if resume and not piece.token_ids and not routed:
                        break
                    yield GenerationChunk(
                        token_ids=piece.token_ids,
                        logprobs=piece.logprobs,
                        weights_versions=piece.versions or (version,) * len(piece.token_ids),
                        routed_experts=routed,
                        finish_reason=None if resume else finish,
                        prompt_tokens=len(prompt),
                    )
                    if finish is not None:
                        break
            finally:
                ended.set()
                self._inflight.pop(rid, None)
                preempted = rid in self._preempted
                self._preempted.discard(rid)
                if finish is None:  # the consumer left, or the request failed: free it
                    await self._abort(rid)
            if not (finish == "abort" and preempted):
                return

    async def _request(
        self, body: dict[str, Any], rid: str, *, prompt_tokens: int
    ) -> AsyncIterator[Any]:
        """One streamed ``/generate`` request's pieces, errors mapped to the contract's."""
        seen = 0
        try:
            async with self.client.stream("POST", f"{self.url}/generate", json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise self._error(response.status_code, response_json(response), prompt_tokens)
                async for data in sse_data(response):
                    if isinstance(data, dict) and "error" in data and "meta_info" not in data:
                        raise self._error(400, data, prompt_tokens)
                    piece = read_output(
                        data,
                        seen=seen,
                        prompt_tokens=prompt_tokens,
                        experts_per_token=self._experts_per_token,
                    )
                    seen = piece.completion_tokens
                    if piece.finish_reason == "abort" and rid not in self._preempted:
                        # SGLang aborts a request it cannot serve (a prompt too long for
                        # its scheduler) with the reason in the finish message
                        overflow = context_overflow(
                            piece.message,
                            prompt_tokens=prompt_tokens,
                            max_context=self._max_context,
                        )
                        if overflow is not None:
                            raise overflow
                    if piece.token_ids or piece.finish_reason is not None:
                        yield piece
                    if piece.finish_reason is not None:
                        return
        except httpx.TransportError as exc:
            raise self._unanswered(exc) from exc
        except (ProtocolError, json.JSONDecodeError) as exc:
            raise EngineUnavailable(f"SGLang server {self.url}: {exc}") from exc
        raise EngineUnavailable(
            f"SGLang server {self.url} ended the stream without a finish_reason"
        )

    def _error(self, status: int, data: Any, prompt_tokens: int) -> Exception:
        if status >= 500:
            return self._server_error(status, data)
        return error_for(status, data, prompt_tokens=prompt_tokens, max_context=self._max_context)

    async def _abort(self, rid: str) -> None:
        """Ask the server to drop request ``rid`` (best effort: it may have ended)."""
        try:
            await self.client.post(f"{self.url}/abort_request", json={"rid": rid}, timeout=10)
        except httpx.HTTPError as exc:
            log.warning("sglang abort_request failed", url=self._url, rid=rid, error=str(exc))

    async def abort(self, rid: str) -> None:
        """Abort one request by its rid (what partial updates do to every in-flight one)."""
        await self._abort(rid)

    async def flush_cache(self) -> bool:
        """Empty the server's radix (prefix) cache; false when the server refused (it does
        while requests run)."""
        response = await self.client.post(f"{self.url}/flush_cache", timeout=60)
        return response.status_code == 200

    async def update_weights(
        self,
        state_dict: Mapping[str, Any],
        *,
        version: int | None = None,
        mode: UpdateMode = "drain",
    ) -> int:
        """Load new weights by the route ``[engine] weight_update`` names (``transfer``), or
        a LoRA update as the server's adapter (``adapters``).

        ``"drain"``: new requests wait, running ones finish, then the swap. ``"partial"``:
        running requests are aborted at a token boundary and continue afterwards under
        the new weights (``stream``)."""
        check_update_mode(mode)
        if self._transfer is None:
            raise UsageError(
                "this SGLang engine is configured with weight_update = 'none'; set it to "
                "'disk', 'distributed' or 'tensor' to push weights from the trainer"
            )
        lora = state_dict if is_lora(state_dict) else None
        if lora is not None:  # before any request is aborted for it
            self._adapters.check(lora)
        new_version = version if version is not None else self._version + 1
        async with self._swap():
            running = dict(self._inflight)
            if mode == "partial":
                self._preempted.update(running)
                await asyncio.gather(*(self._abort(rid) for rid in running))
            await asyncio.gather(*(event.wait() for event in running.values()))
            if lora is not None:
                await self._adapters.load(self._server(), lora, new_version)
            else:
                await self._transfer.push(self._server(), state_dict, new_version)
            self._version = new_version
            return new_version

    def _server(self) -> Server:
        return Server(url=self.url, client=self.client)

    async def close(self) -> None:
        """Leave the weight group (if one was opened) and unload our adapter from an
        attached server (it outlives us), then stop or detach from the server."""
        try:
            if not self._closed and self._transfer is not None and self._url is not None:
                if self.server is None:
                    await self._adapters.close(self._server())
                await self._transfer.close(self._server())
        finally:
            await super().close()


def _experts_per_token(config: SglangEngineConfig) -> int:
    """``num_experts_per_tok`` from the local model folder's config.json."""
    source = Path(config.tokenizer or config.model) / "config.json"
    try:
        data = json.loads(source.read_text())
    except (OSError, ValueError):
        data = {}
    for section in (data, data.get("text_config") or {}):
        k = section.get("num_experts_per_tok") or section.get("moe_topk")
        if k:
            return int(k)
    raise UsageError(
        f"return_routed_experts is set but {source} names no num_experts_per_tok; set "
        f"[engine] experts_per_token to the model's number of experts per token"
    )


def weight_folders(config: SglangEngineConfig) -> WeightFolders:
    return WeightFolders(
        config.weights_dir,
        source=config.tokenizer or config.model,
        keep=config.keep_weight_versions,
    )


async def start_engines(config: SglangEngineConfig) -> list[SglangEngine]:
    """Start (or attach to) every configured server, concurrently; the replicas share one
    tokenizer and one weights folder (each update is written once)."""
    if not config.urls:
        find_python(config)  # a launch that cannot start fails before the tokenizer loads
    tokenizer = await asyncio.to_thread(load_tokenizer, config)
    weights = weight_folders(config)
    return await start_replicas(
        lambda url, i: SglangEngine(config, url=url, index=i, tokenizer=tokenizer, weights=weights),
        urls=config.urls,
        replicas=config.replicas,
    )


def create_engine(config: SglangEngineConfig | None = None) -> SglangEngine | LoadBalancer:
    """The registered factory: one server's engine, or a balancer over several."""
    return balanced(run_sync(start_engines(config or SglangEngineConfig())))
