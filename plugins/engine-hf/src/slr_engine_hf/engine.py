"""``HfEngine``: the embedded transformers engine (CPU by default, one GPU if asked)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import torch

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
from slr.engines.lora import is_adapter_folder, load_weights, read_adapter
from slr_engine_hf.attention import use_decode_attention
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.models import resolve
from slr_engine_hf.scheduler import Request, Scheduler

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = structlog.get_logger()

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HfEngine:
    """Implements ``slr.contracts.Engine`` with transformers and a continuous-batching loop.

    Build it from config (``HfEngine(HfEngineConfig(model=...))``) or, in tests, from a
    model object: ``HfEngine.from_model(model, tokenizer)``.
    """

    def __init__(self, config: HfEngineConfig | None = None, **overrides: Any) -> None:
        config = config or HfEngineConfig()
        if overrides:
            from attrs import evolve

            config = evolve(config, **overrides)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if config.threads:
            torch.set_num_threads(config.threads)
        folder = resolve(config.model)
        # A LoRA adapter folder (a LoRA checkpoint's servable weights) is served over the base
        # model it names, applied as a weight update would apply it.
        adapter = read_adapter(folder) if is_adapter_folder(folder) else None
        base = resolve(adapter.lora.base_model) if adapter and adapter.lora else folder
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=_DTYPES[config.dtype])
        # PreTrainedModel.to is wrapped in a decorator whose annotations lose the bound self.
        model.to(config.device)  # pyright: ignore[reportArgumentType]
        if adapter is not None:
            load_weights(model, adapter)
        has_tokenizer = (folder / "tokenizer_config.json").is_file()
        tokenizer = AutoTokenizer.from_pretrained(str(folder if has_tokenizer else base))
        self._setup(model, tokenizer, config, source=str(folder))

    @classmethod
    def from_model(
        cls, model: PreTrainedModel, tokenizer: Any, config: HfEngineConfig | None = None
    ) -> HfEngine:
        """Serve a model object already in memory (tests, the embedded trainer)."""
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, config or HfEngineConfig(), source=type(model).__name__)
        return engine

    @classmethod
    def from_folder(cls, path: str | Path, **overrides: Any) -> HfEngine:
        return cls(HfEngineConfig(model=str(path)), **overrides)

    def _setup(self, model: Any, tokenizer: Any, config: HfEngineConfig, *, source: str) -> None:
        model.eval()
        # decode steps attend over the batch's cache in place (prefill and any trainer
        # sharing this model keep transformers' sdpa exactly)
        use_decode_attention(model)
        self.config = config
        self.model = model
        self._tokenizer = tokenizer
        limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self._max_context = config.max_context or limit or 4096
        if limit and self._max_context > limit:
            raise ValueError(
                f"max_context={self._max_context} exceeds the model's own limit {limit}; "
                f"set max_context to at most {limit}"
            )
        eos: set[int] = set()
        for ids in (
            getattr(getattr(model, "generation_config", None), "eos_token_id", None),
            model.config.eos_token_id,
            tokenizer.eos_token_id,
        ):
            if ids is None:
                continue
            eos.update([ids] if isinstance(ids, int) else ids)
        self._vocab = int(model.config.get_text_config().vocab_size)
        self._closed = False
        self._scheduler = Scheduler(
            model=model,
            tokenizer=tokenizer,
            max_batch=config.max_batch,
            max_context=self._max_context,
            eos_token_ids=eos,
            prefix_cache_tokens=config.prefix_cache_tokens,
            routing_k=self._routing_k(model) if config.return_routed_experts else 0,
        )
        self._scheduler.start()
        log.info(
            "hf engine ready",
            model=source,
            device=str(next(model.parameters()).device),
            max_context=self._max_context,
            max_batch=config.max_batch,
        )

    @staticmethod
    def _routing_k(model: Any) -> int:
        k = getattr(model.config.get_text_config(), "num_experts_per_tok", None)
        if not k:
            raise ValueError(
                f"return_routed_experts is set but {type(model).__name__} is not a "
                f"mixture-of-experts model (its config has no num_experts_per_tok)"
            )
        return int(k)

    # -- the Engine protocol --------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def weights_version(self) -> int:
        return self._scheduler.version

    def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        """Tokens as the scheduler samples them; closing the stream frees the sequence."""
        return _TokenStream(self, [int(t) for t in prompt_ids], sampling, session_id)

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        return await collect(self.stream(prompt_ids, sampling, session_id=session_id))

    async def force_decode(
        self,
        prompt_ids: Sequence[int],
        token_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
    ) -> Generation:
        """Forced decoding (``slr.contracts.ForcedDecoding``): the ``Generation`` this engine
        would return had it sampled exactly ``token_ids`` after ``prompt_ids``: each
        token's log-prob under ``sampling.temperature``, the routing of every token fed,
        ``finish_reason`` ``"stop"`` when the last token is EOS or a stop token (else
        ``"length"``). One forward pass; the prefix cache is used and filled as usual."""
        forced = [int(t) for t in token_ids]
        if not forced:
            raise ValueError("force_decode needs at least one token to score; got none")
        self._check_ids(forced, "forced token ids")
        prompt = [int(t) for t in prompt_ids]
        if len(prompt) + len(forced) > self._max_context:
            raise ContextOverflow(len(prompt) + len(forced), self._max_context)
        stream = _TokenStream(self, prompt, sampling, session_id, forced=forced)
        return await collect(stream)

    def _check_ids(self, ids: list[int], what: str) -> None:
        bad = [t for t in ids if not 0 <= t < self._vocab]
        if bad:
            raise ValueError(
                f"{what} {bad[:5]} are outside the vocabulary (0..{self._vocab - 1}); "
                f"tokenize with this engine's tokenizer"
            )

    def _request(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        session_id: str | None,
        forced: list[int] | None = None,
    ) -> Request:
        if not prompt:
            raise ValueError("generate needs at least one prompt token; got an empty prompt")
        if len(prompt) >= self._max_context:
            raise ContextOverflow(len(prompt), self._max_context)
        self._check_ids(prompt, "prompt token ids")
        if self._closed:
            raise EngineUnavailable("this hf engine is closed")
        return Request(
            prompt=prompt, sampling=sampling, session_id=session_id, future=Future(), forced=forced
        )

    async def update_weights(
        self,
        state_dict: Mapping[str, Any],
        *,
        version: int | None = None,
        mode: UpdateMode = "drain",
    ) -> int:
        """Copy ``state_dict`` into the served model; returns the new version. A LoRA update
        (``slr.contracts.weights.WeightUpdate``, kind ``"lora"``) puts its adapter on the
        model's own base weights (peft's layers, ``slr.engines.lora.load_weights``), so the engine
        computes exactly what the trainer's adapted model computes.

        ``"drain"``: once running generations finish (new ones wait meanwhile).
        ``"partial"``: at the next token boundary; running generations continue under the
        new weights, and each token records the version that sampled it.
        """
        check_update_mode(mode)
        if self._closed:
            raise EngineUnavailable("this hf engine is closed")
        future = self._scheduler.update(state_dict, version, partial=mode == "partial")
        return await asyncio.wrap_future(future)

    async def health(self) -> bool:
        return not self._closed and self._scheduler.alive

    async def close(self) -> None:
        """Stop serving; calls in flight fail with ``EngineUnavailable`` rather than hang."""
        if self._closed:
            return
        self._closed = True
        self._scheduler.stop(EngineUnavailable("the hf engine was closed"))
        await asyncio.to_thread(self._scheduler.join, 60)

    # -- extras -----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters for dashboards and benchmarks."""
        s = self._scheduler
        return {
            "load": s.load,
            "steps": s.steps,
            "generated_tokens": s.generated_tokens,
            "prefill_tokens": s.prefill_tokens,
            "prefill_passes": s.prefill_passes,
            "prefix_cache_hits": s.prefix_cache.hits,
            "prefix_cache_reused_tokens": s.prefix_cache.reused_tokens,
            "prefix_cache_tokens": s.prefix_cache.tokens,
            "prefix_cache_evicted_tokens": s.prefix_cache.evicted_tokens,
            "weights_version": s.version,
            "cancelled": s.cancelled,
            "resumed": s.resumed,
        }


class _TokenStream:
    """One streamed generation, as an async iterator of ``GenerationChunk``.

    Submitted on the first ``__anext__`` (so its errors surface there). The scheduler's
    thread hands chunks to this stream's event loop; when the consumer stops (``aclose``,
    cancellation, or the iterator being dropped) the request is marked cancelled and the
    scheduler frees its slot at the next step.
    """

    def __init__(
        self,
        engine: HfEngine,
        prompt: list[int],
        sampling: SamplingParams,
        session_id: str | None,
        *,
        forced: list[int] | None = None,
    ) -> None:
        self._engine = engine
        self._args = (prompt, sampling, session_id, forced)
        self._request: Request | None = None
        self._queue: asyncio.Queue[GenerationChunk | BaseException] = asyncio.Queue()
        self._done = False

    def __aiter__(self) -> _TokenStream:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self._done:
            raise StopAsyncIteration
        if self._request is None:
            self._start()
        try:
            item = await self._queue.get()
        except BaseException:  # cancelled while waiting: the consumer is gone
            self._cancel()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finish_reason is not None:
            self._done = True
        return item

    async def aclose(self) -> None:
        self._cancel()

    def __del__(self) -> None:
        self._cancel()

    def _start(self) -> None:
        try:
            request = self._engine._request(*self._args)
        except BaseException:
            self._done = True
            raise
        loop = asyncio.get_running_loop()
        queue = self._queue

        def deliver(item: GenerationChunk | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the consumer's loop is gone: nobody is listening
                request.cancelled = True

        def on_done(future: Future) -> None:
            if not future.cancelled() and future.exception() is not None:
                deliver(future.exception())  # type: ignore[arg-type]

        request.emit = deliver
        request.future.add_done_callback(on_done)
        self._request = request
        try:
            self._engine._scheduler.submit(request)
        except BaseException:
            self._done = True
            raise

    def _cancel(self) -> None:
        if self._request is not None and not self._done:
            self._request.cancelled = True
        self._done = True
