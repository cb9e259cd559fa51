"""``VllmEngine``: one vLLM server (launched or attached) behind the Engine contract.

Every generation is a stream of ``/v1/completions`` requests: normally one. When a
``"partial"`` weight update arrives, each in-flight request is closed at the last token
the engine has read (vLLM aborts a request whose client left), the new weights are
loaded, and the generation continues as a new request whose prompt is the original prompt
plus the tokens so far, under the new weights (the server recomputes their KV: the update
clears its prefix cache). Each token records the version of the request that sampled it.
A request's HTTP stream is read by its own task (``_read``), so an update never waits on a
slow consumer of the stream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import structlog

from slr.contracts import (
    ContextOverflow,
    EngineUnavailable,
    Generation,
    GenerationChunk,
    SamplingParams,
    UpdateMode,
)
from slr.contracts.engine import check_update_mode, collect
from slr.contracts.weights import WeightUpdate, is_lora
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
from slr_engine_vllm.config import VllmEngineConfig
from slr_engine_vllm.protocol import (
    ProtocolError,
    completion_request,
    error_for,
    parse_chunk,
    parse_completion,
)
from slr_engine_vllm.server import launch_server
from slr_engine_vllm.weights import Transport, WeightSync, write_checkpoint

log = structlog.get_logger()

_ENDED = object()  # put on a request's queue when its reader task is done, however it ended


def _put_ended(queue: asyncio.Queue[Any], _: asyncio.Task[None]) -> None:
    queue.put_nowait(_ENDED)


def _versions_dir(configured: str, prefix: str) -> Path:
    """A fresh folder for the versioned files the server reads (weights, adapters): under
    ``configured`` (a shared path for servers elsewhere), or a temporary one."""
    base = Path(configured) if configured else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def _keep_only(folder: Path) -> None:
    """Remove the other versions beside ``folder``: the server holds its contents now."""
    for old in folder.parent.iterdir():
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


class VllmEngine(HttpEngine):
    """Implements ``slr.contracts.Engine`` against one vLLM server.

    ``await engine.start()`` launches the server (or checks an attached one) and learns
    its context length (``slr.engines.remote.HttpEngine``); ``create_engine`` does that
    for the run. A transport error, a 5xx
    or a dead process raises ``EngineUnavailable`` (the balancer then fails over); a 4xx
    raises ``ValueError`` or ``ContextOverflow`` (the request itself was wrong).
    """

    label = "vLLM"
    config: VllmEngineConfig

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
        super().__init__(config, url=url, index=index, tokenizer=tokenizer, client=client)
        self._adapter: str | None = None  # the LoRA adapter's name once one is loaded
        self._lora_dir: Path | None = None
        self._weights_dir: Path | None = None  # weight_transfer = "disk": one folder a version
        self._weights = WeightSync(
            transport=transport, trainer_address=config.trainer_address or None
        )
        self._readers: set[asyncio.Task[None]] = set()  # in-flight streamed requests

    def launch(self) -> ServerProcess:
        return launch_server(self.config, index=self.index)

    async def start(self) -> VllmEngine:
        await super().start()
        return self

    def pick_max_context(self, cards: list[dict[str, Any]]) -> int | None:
        for card in cards:  # the card of the model we serve: a server may serve several
            if card.get("id") == self.config.served_model_name and card.get("max_model_len"):
                return int(card["max_model_len"])
        return None

    def no_max_context(self) -> UsageError:
        return UsageError(
            f"{self.url} does not serve {self.config.served_model_name!r} with a max_model_len; "
            f"set [engine] served_model_name to what the server serves, or max_context"
        )

    # -- the Engine protocol --------------------------------------------------------------

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
            model=self._adapter or self.config.served_model_name,
            allow_truncated_logprobs=self.config.allow_truncated_logprobs,
        )
        if stream:
            body["stream"] = True
        await self._no_swap()
        return body, self._version

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        """The collected ``stream`` (so a partial update can pause it at a token boundary);
        with ``return_routed_experts`` one whole completion (vLLM streams no routing)."""
        if self.config.return_routed_experts:
            return await self._whole(prompt_ids, sampling, session_id=session_id)
        return await collect(self.stream(prompt_ids, sampling, session_id=session_id))

    async def _whole(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None
    ) -> Generation:
        """One non-streamed completion."""
        body, version = await self._request(prompt_ids, sampling, stream=False)
        headers = {"X-Session-Id": session_id} if session_id else {}
        try:
            response = await self.client.post(
                f"{self.url}/v1/completions", json=body, headers=headers
            )
        except httpx.TransportError as exc:
            raise self._unanswered(exc) from exc
        data = response_json(response)
        if response.status_code >= 500:
            raise self._server_error(response.status_code, data)
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
        the stream closes the HTTP response, and vLLM aborts a request whose client left.
        Across a partial weight update the generation continues as a new request (see the
        module docstring).

        vLLM's streamed choices carry no routed experts: with ``return_routed_experts`` the
        whole completion is asked for at once and yielded as one chunk."""
        if self.config.return_routed_experts:
            gen = await self._whole(prompt_ids, sampling, session_id=session_id)
            yield GenerationChunk(
                token_ids=gen.token_ids,
                logprobs=gen.logprobs,
                weights_versions=gen.weights_versions,
                routed_experts=gen.routed_experts,
                finish_reason=gen.finish_reason,
                prompt_tokens=gen.prompt_tokens,
            )
            return
        headers = {"X-Session-Id": session_id} if session_id else {}
        prompt = [int(t) for t in prompt_ids]
        generated: list[int] = []
        while True:
            context = prompt + generated
            if generated and self._max_context and len(context) >= self._max_context:
                yield GenerationChunk(finish_reason="length", prompt_tokens=len(prompt))
                return  # resumed with the context full: where the server would have stopped
            left = attrs.evolve(sampling, max_tokens=sampling.max_tokens - len(generated))
            body, version = await self._request(context, left, stream=True)
            chunks: asyncio.Queue[Any] = asyncio.Queue()
            reader = asyncio.create_task(
                self._read(body, headers, prompt_tokens=len(context), version=version, out=chunks)
            )
            self._readers.add(reader)
            reader.add_done_callback(self._readers.discard)
            reader.add_done_callback(functools.partial(_put_ended, chunks))
            finished = False
            try:
                while (chunk := await chunks.get()) is not _ENDED:
                    generated += chunk.token_ids
                    finished = chunk.finish_reason is not None
                    yield attrs.evolve(chunk, prompt_tokens=len(prompt))
                    if finished:
                        return
            finally:
                if not finished:  # the consumer left mid-stream: close the request now
                    if reader in self._readers:  # (not once its last chunk is read: _read)
                        reader.cancel()
                    await asyncio.wait([reader])  # the response closed: vLLM aborts it
            if not reader.cancelled():  # cancelled: a partial update took it; go on
                reader.result()  # raises what the request raised
                raise EngineUnavailable(
                    f"vLLM server {self.url} ended the stream without a finish_reason"
                )

    async def _read(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        *,
        prompt_tokens: int,
        version: int,
        out: asyncio.Queue[Any],
    ) -> None:
        """One streamed request: its chunks onto ``out``, errors mapped to the contract's.
        Cancelling it closes the response (vLLM then aborts the request)."""
        try:
            async with self.client.stream(
                "POST", f"{self.url}/v1/completions", json=body, headers=headers
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    data = response_json(response)
                    if response.status_code >= 500:
                        raise self._server_error(response.status_code, data)
                    raise error_for(
                        response.status_code,
                        data,
                        prompt_tokens=prompt_tokens,
                        max_context=self._max_context,
                    )
                async for data in sse_data(response):
                    chunk = parse_chunk(data, prompt_tokens=prompt_tokens, weights_version=version)
                    out.put_nowait(chunk)
                    if chunk.finish_reason is not None:
                        # done: no partial update may cancel it now. A task cancelled while
                        # it closes the response leaks the connection from httpx's pool
                        # (100 such requests, and every later one waits for a connection)
                        self._readers.discard(asyncio.current_task())  # type: ignore[arg-type]
                        return
        except httpx.TransportError as exc:
            raise self._unanswered(exc) from exc
        except (ProtocolError, json.JSONDecodeError) as exc:
            raise EngineUnavailable(f"vLLM server {self.url}: {exc}") from exc

    async def _preempt(self) -> None:
        """Close every in-flight request at the last token read, and wait until each is
        closed; their streams resume once the swap is done (``stream``)."""
        readers = list(self._readers)
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    async def update_weights(
        self,
        state_dict: Mapping[str, Any],
        *,
        version: int | None = None,
        mode: UpdateMode = "drain",
    ) -> int:
        """Pause the server, bring the weights in, resume; see ``weights.WeightSync``. A
        LoRA update is loaded as an adapter instead (``WeightSync.load_adapter``).

        ``"drain"``: new requests wait and the server finishes the running ones
        (``/pause?mode=wait``) before the swap. ``"partial"``: the running requests are
        closed at a token boundary first, and continue under the new weights (``stream``).
        From disk, the folder is written before anything pauses."""
        check_update_mode(mode)
        partial = mode == "partial"
        if partial and self.config.return_routed_experts:
            raise NotImplementedError(
                "a partial weight update cannot pause a vLLM generation with "
                "return_routed_experts: vLLM returns routed experts only with the whole "
                "completion, so such a generation has no token boundary to stop at; use "
                "mode='drain'"
            )
        if is_lora(state_dict):
            return await self._load_adapter(state_dict, version, partial=partial)
        if self.config.weight_transfer == "none":
            raise UsageError(
                "this vLLM engine is configured with weight_transfer = 'none'; set it to "
                "'nccl' (GPUs) or 'disk' to push weights from the trainer"
            )
        new_version = version if version is not None else self._version + 1
        folder = None
        if self.config.weight_transfer == "disk":
            if self._weights_dir is None:
                self._weights_dir = _versions_dir(self.config.weights_dir, f"weights-{self.index}-")
            folder = self._weights_dir / f"v{new_version:06d}"
            await asyncio.to_thread(write_checkpoint, folder, state_dict)
        async with self._swap():
            if partial:
                await self._preempt()
            if folder is not None:
                await self._weights.load_folder(folder, url=self.url, client=self.client)
                _keep_only(folder)
            else:
                await self._weights.push(state_dict, url=self.url, client=self.client)
            self._version = new_version
            return new_version

    async def _load_adapter(
        self, update: WeightUpdate, version: int | None, *, partial: bool
    ) -> int:
        spec = update.lora
        assert spec is not None  # a "lora" update carries its spec
        if spec.rank > self.config.max_lora_rank:
            raise UsageError(
                f"a rank-{spec.rank} LoRA update needs [engine] max_lora_rank >= {spec.rank} "
                f"(now {self.config.max_lora_rank}): vLLM serves adapters only up to the "
                f"rank it was launched with (--max-lora-rank)"
            )
        new_version = version if version is not None else self._version + 1
        if self._lora_dir is None:
            self._lora_dir = _versions_dir(self.config.lora_dir, f"lora-{self.index}-")
        name = f"{self.config.served_model_name}-lora"
        folder = self._lora_dir / f"v{new_version:06d}"
        async with self._swap():
            if partial:
                await self._preempt()
            await self._weights.load_adapter(
                update, url=self.url, client=self.client, name=name, folder=folder
            )
        _keep_only(folder)
        self._adapter = name  # requests name the adapter from now on
        self._version = new_version
        return new_version


async def start_engines(config: VllmEngineConfig) -> list[VllmEngine]:
    """Start (or attach to) every configured server, concurrently."""
    tokenizer = await asyncio.to_thread(load_tokenizer, config)
    return await start_replicas(
        lambda url, i: VllmEngine(config, url=url, index=i, tokenizer=tokenizer),
        urls=config.urls,
        replicas=config.replicas,
    )


def create_engine(config: VllmEngineConfig | None = None) -> VllmEngine | LoadBalancer:
    """The registered factory: one server's engine, or a balancer over several."""
    return balanced(run_sync(start_engines(config or VllmEngineConfig())))
