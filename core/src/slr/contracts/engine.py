"""The engine contract: token ids in, token ids + log-probs out, streamed or collected."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from slr.contracts.records import FinishReason, Generation, GenerationChunk, SamplingParams
from slr.contracts.routing import RoutedExperts

#: How ``update_weights`` treats generations in flight (docs/engines.md, "Weight updates").
UpdateMode = Literal["drain", "partial"]
UPDATE_MODES: tuple[str, ...] = ("drain", "partial")


@runtime_checkable
class Engine(Protocol):
    """An inference engine serving the policy.

    ``stream`` and ``generate`` never re-tokenize: they take the exact prompt ids and give
    the exact sampled ids with their behaviour log-probs (definition on ``Generation``).
    ``generate`` is the collected ``stream``. ``weights_version`` counts ``update_weights``
    calls; every token records the version that sampled it (``weights_versions``): with a
    ``"partial"`` update a generation may span two versions.
    """

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer (chat template included) matching the served model."""
        ...

    @property
    def max_context(self) -> int:
        """The most tokens (prompt + completion) the engine accepts."""
        ...

    @property
    def weights_version(self) -> int: ...

    def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        """Sample a completion, yielding chunks as tokens are sampled; the last chunk has a
        ``finish_reason``. Closing the iterator (or cancelling its consumer) frees the
        sequence at the next token boundary. Errors as ``generate``, raised on iteration."""
        ...

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        """Sample a completion. A prompt longer than ``max_context`` raises ``ContextOverflow``."""
        ...

    async def update_weights(
        self,
        state_dict: Mapping[str, Any],
        *,
        version: int | None = None,
        mode: UpdateMode = "drain",
    ) -> int:
        """Swap in new weights; returns the new version. ``"drain"``: between generations
        (running ones finish first). ``"partial"``: in-flight generations pause at a token
        boundary and continue under the new weights. ``state_dict`` may be a
        ``slr.contracts.weights.WeightUpdate`` of kind ``"lora"``: apply the adapter over the
        engine's base weights, or raise (``require_full``) if the engine cannot."""
        ...

    async def health(self) -> bool:
        """True while the engine can serve."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class SessionPinning(Protocol):
    """An engine that keeps each session on one replica (optional; the load balancer): the
    proxy tells it when a session closes, so it lets go of the pin."""

    def forget(self, session_id: str) -> None: ...


@runtime_checkable
class ForcedDecoding(Protocol):
    """An engine that can score a given completion instead of sampling one (optional).

    ``force_decode(prompt_ids, token_ids, sampling)`` returns the ``Generation`` the engine
    would have returned had it sampled exactly ``token_ids``: the same log-prob definition
    (``log_softmax(logits / T)`` over the full vocabulary, fp32), routing of every token
    fed, ``weights_versions``. Replays use it to push a recorded session through the proxy
    with exact, engine-computed behaviour log-probs (docs/engines.md, "Forced decoding").
    """

    async def force_decode(
        self,
        prompt_ids: Sequence[int],
        token_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
    ) -> Generation: ...


@runtime_checkable
class StatsReporting(Protocol):
    """An engine that keeps counters of its own (optional; the hf engine's load, steps,
    tokens, prefix-cache hits): a Ray replica hands them to whoever asks
    (``slr.cluster.engines``), for dashboards and benchmarks."""

    def stats(self) -> Mapping[str, float]: ...


@runtime_checkable
class ClosableStream(Protocol):
    """A stream that can be closed before its end (an async generator's ``aclose``).

    What ``Engine.stream`` returns usually is one: whoever stops reading early closes it,
    so the engine frees the sequence at the next token boundary instead of sampling on."""

    async def aclose(self) -> None: ...


class ChunkCollector:
    """Adds chunks up into the ``Generation`` they make (what ``generate`` returns)."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.weights_versions: list[int] = []
        self.routed_experts: RoutedExperts | None = None
        self.finish_reason: FinishReason | None = None
        self.prompt_tokens = 0

    def add(self, chunk: GenerationChunk) -> None:
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.weights_versions += chunk.weights_versions
        if chunk.routed_experts is not None:
            self.routed_experts = (
                chunk.routed_experts
                if self.routed_experts is None
                else self.routed_experts + chunk.routed_experts
            )
        self.prompt_tokens = chunk.prompt_tokens or self.prompt_tokens
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason

    def generation(self) -> Generation:
        if self.finish_reason is None:
            raise EngineUnavailable("the engine's stream ended without a final chunk")
        versions = self.weights_versions
        return Generation(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            routed_experts=self.routed_experts,
            weights_version=versions[0] if versions else 0,
            weights_versions=versions,
            prompt_tokens=self.prompt_tokens,
        )


async def collect(chunks: AsyncIterator[GenerationChunk]) -> Generation:
    """The ``Generation`` a stream adds up to: what ``generate`` returns."""
    collector = ChunkCollector()
    try:
        async for chunk in chunks:
            collector.add(chunk)
            if chunk.finish_reason is not None:
                break
    finally:
        if isinstance(chunks, ClosableStream):
            await chunks.aclose()
    return collector.generation()


def check_update_mode(mode: str) -> None:
    if mode not in UPDATE_MODES:
        raise ValueError(f"update_weights mode = {mode!r} is not one of {', '.join(UPDATE_MODES)}")


class ContextOverflow(ValueError):
    """The prompt (plus the requested completion room) does not fit the engine's context."""

    def __init__(self, prompt_tokens: int, max_context: int) -> None:
        super().__init__(
            f"prompt is {prompt_tokens} tokens but the model's context is {max_context}; "
            f"shorten the conversation or raise the engine's max_context"
        )
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context


class EngineUnavailable(RuntimeError):
    """The engine (or every replica) is down; the trial ends with ``engine_error``."""
