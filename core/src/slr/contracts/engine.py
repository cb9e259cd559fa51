"""The engine contract: token ids in, token ids + log-probs out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from slr.contracts.records import Generation, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """An inference engine serving the policy.

    ``generate`` never re-tokenizes: it takes the exact prompt ids and returns the exact
    sampled ids with their behaviour log-probs (definition on ``Generation``).
    ``weights_version`` counts ``update_weights`` calls; every Generation records the version
    that produced it, and a generation never spans two versions.
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

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        """Sample a completion. A prompt longer than ``max_context`` raises ``ContextOverflow``."""
        ...

    async def update_weights(
        self, state_dict: Mapping[str, Any], *, version: int | None = None
    ) -> int:
        """Swap in new weights between generations; returns the new version."""
        ...

    async def health(self) -> bool:
        """True while the engine can serve."""
        ...

    async def close(self) -> None: ...


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
