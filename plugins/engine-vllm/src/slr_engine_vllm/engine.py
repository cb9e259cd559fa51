"""``VllmEngine``: one vLLM server (launched or attached) behind the Engine contract."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
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
from slr.contracts.weights import WeightUpdate, is_lora
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
from slr_engine_vllm.weights import Transport, WeightSync

log = structlog.get_logger()


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

        vLLM's streamed choices carry no routed experts: with ``return_routed_experts`` the
        whole completion is asked for at once and yielded as one chunk."""
        if self.config.return_routed_experts:
            gen = await self.generate(prompt_ids, sampling, session_id=session_id)
            yield GenerationChunk(
                token_ids=gen.token_ids,
                logprobs=gen.logprobs,
                weights_versions=gen.weights_versions,
                routed_experts=gen.routed_experts,
                finish_reason=gen.finish_reason,
                prompt_tokens=gen.prompt_tokens,
            )
            return
        body, version = await self._request(prompt_ids, sampling, stream=True)
        headers = {"X-Session-Id": session_id} if session_id else {}
        n = len(prompt_ids)
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
                        response.status_code, data, prompt_tokens=n, max_context=self._max_context
                    )
                async for data in sse_data(response):
                    chunk = parse_chunk(data, prompt_tokens=n, weights_version=version)
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
        except httpx.TransportError as exc:
            raise self._unanswered(exc) from exc
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
        """Pause the server, stream the weights in, resume; see ``weights.WeightSync``. A
        LoRA update is loaded as an adapter instead (``WeightSync.load_adapter``)."""
        check_update_mode(mode)
        if mode == "partial":
            raise NotImplementedError(
                "partial weight updates are not implemented for vLLM yet: they need vLLM's "
                "in-place pause (keep in-flight requests at a token boundary) or abort + "
                "resume of each request with its tokens so far, driven around /update_weights; "
                "use mode='drain'"
            )
        if is_lora(state_dict):
            return await self._load_adapter(state_dict, version)
        if self.config.weight_transfer == "none":
            raise UsageError(
                "this vLLM engine is configured with weight_transfer = 'none'; set it to "
                "'nccl' (GPUs) or 'disk' to push weights from the trainer"
            )
        async with self._swap():
            new_version = version if version is not None else self._version + 1
            if self.config.weight_transfer == "disk":
                await self._reload_from_disk(state_dict, new_version)
            else:
                await self._weights.push(state_dict, url=self.url, client=self.client)
            self._version = new_version
            return new_version

    async def _reload_from_disk(self, state_dict: Mapping[str, Any], version: int) -> None:
        if self._weights_dir is None:
            base = Path(self.config.weights_dir) if self.config.weights_dir else None
            if base is not None:
                base.mkdir(parents=True, exist_ok=True)
            self._weights_dir = Path(tempfile.mkdtemp(prefix=f"weights-{self.index}-", dir=base))
        folder = self._weights_dir / f"v{version:06d}"
        await self._weights.reload_from_disk(
            state_dict, url=self.url, client=self.client, folder=folder
        )
        for old in self._weights_dir.iterdir():  # the server holds the weights in memory now
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    async def _load_adapter(self, update: WeightUpdate, version: int | None) -> int:
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
            base = Path(self.config.lora_dir) if self.config.lora_dir else None
            if base is not None:
                base.mkdir(parents=True, exist_ok=True)
            self._lora_dir = Path(tempfile.mkdtemp(prefix=f"lora-{self.index}-", dir=base))
        name = f"{self.config.served_model_name}-lora"
        folder = self._lora_dir / f"v{new_version:06d}"
        async with self._swap():
            await self._weights.load_adapter(
                update, url=self.url, client=self.client, name=name, folder=folder
            )
        for old in self._lora_dir.iterdir():  # the server holds the adapter in memory now
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
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
