"""vLLM's token-in / token-out wire format: building requests, reading responses.

The request is an OpenAI-style ``POST /v1/completions`` whose ``prompt`` is a list of
token ids (vLLM accepts ids there and skips tokenization), plus vLLM's extensions:
``top_k``, ``seed``, ``stop_token_ids``, ``return_tokens_as_token_ids`` (log-prob entries
name tokens as ``"token_id:<id>"``, exact even for ids that do not round-trip through
text), ``return_token_ids`` (newer servers also list the sampled ids), and
``skip_special_tokens`` / ``include_stop_str_in_output`` so nothing the model generated is
hidden. ``logprobs: 1`` makes the server report each sampled token's log-prob.

The server must run with ``--logprobs-mode processed_logprobs``: the log-prob of the
sampled token after temperature scaling (vLLM's default, ``raw_logprobs``, ignores the
temperature). Without top-k / top-p that is exactly ``log_softmax(logits / T)``, the
trainer's definition; with them vLLM renormalizes over the kept tokens, so they are
refused unless the engine is configured to allow it.

Streaming uses the same request with ``stream: true``: server-sent events, each a
completion chunk whose choice carries the new tokens' ids and log-probs, the last one its
``finish_reason``, then ``data: [DONE]``.

Routed experts (MoE): a server launched with ``--enable-return-routed-experts`` adds
``routed_experts`` to each non-streamed choice, a base64-encoded ``.npy`` array of shape
``[prompt + generated - 1, MoE layers, top_k]`` (uint8, uint16 or int32): every token the
model ran, the prompt included, as the hf engine reports it (vLLM's
``CompletionResponseChoice`` in ``vllm/entrypoints/openai/completion/protocol.py``). No
request field asks for it (``routed_experts_prompt_start`` could skip a prefix; it is
left at 0), and streamed choices do not carry it. ``parse_routed_experts`` also reads the
nested-list form (``[token][layer][ids]``) some servers and stand-ins send.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Any

from slr.contracts import (
    ContextOverflow,
    Generation,
    GenerationChunk,
    RoutedExperts,
    SamplingParams,
)
from slr.contracts.records import FinishReason
from slr.engines.protocol import error_message, short_repr

_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
_CONTEXT = re.compile(r"maximum (?:context|model) length is (\d+)", re.IGNORECASE)
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class ProtocolError(RuntimeError):
    """The server answered with something that is not a vLLM completion response."""


def completion_request(
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    *,
    model: str,
    allow_truncated_logprobs: bool = False,
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/completions`` for one generation."""
    if not allow_truncated_logprobs and (sampling.top_k or sampling.top_p < 1.0):
        raise ValueError(
            f"top_k={sampling.top_k} / top_p={sampling.top_p}: vLLM would report log-probs "
            f"renormalized over the kept tokens, not log_softmax(logits / temperature) as the "
            f"trainer computes them. Use top_k=0 and top_p=1.0, or set the engine's "
            f"allow_truncated_logprobs = true if you accept the mismatch."
        )
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt_ids],
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        # vLLM reads 0 and -1 as "no top-k"; -1 is accepted by every version
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "n": 1,
        "stream": False,
        "logprobs": 1,
        "echo": False,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    return body


def parse_completion(data: Any, *, prompt_tokens: int, weights_version: int) -> Generation:
    """A ``Generation`` from a completion response, or ``ProtocolError`` saying what's off."""
    choice = _choice(data)
    ids, values = _tokens(choice)
    reason = _FINISH.get(str(choice.get("finish_reason")))
    if reason is None:
        raise ProtocolError(f"unknown finish_reason {choice.get('finish_reason')!r}")
    return Generation(
        token_ids=ids,
        logprobs=values,
        finish_reason=reason,
        routed_experts=parse_routed_experts(choice.get("routed_experts")),
        weights_version=weights_version,
        prompt_tokens=prompt_tokens,
    )


def parse_chunk(data: Any, *, prompt_tokens: int, weights_version: int) -> GenerationChunk:
    """A ``GenerationChunk`` from one streamed completion chunk."""
    choice = _choice(data)
    ids, values = _tokens(choice, allow_empty=True)
    raw = choice.get("finish_reason")
    reason = _FINISH.get(str(raw)) if raw is not None else None
    if raw is not None and reason is None:
        raise ProtocolError(f"unknown finish_reason {raw!r}")
    return GenerationChunk(
        token_ids=ids,
        logprobs=values,
        weights_versions=[weights_version] * len(ids),
        routed_experts=parse_routed_experts(choice.get("routed_experts")),
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
    )


def parse_routed_experts(value: Any) -> RoutedExperts | None:
    """A choice's ``routed_experts``: vLLM's base64 ``.npy`` string, nested lists, or None."""
    if value is None:
        return None
    try:
        if isinstance(value, str):
            return RoutedExperts.from_npy(base64.b64decode(value, validate=True))
        return RoutedExperts.from_lists(value)
    except (ValueError, TypeError, IndexError, SyntaxError, binascii.Error) as exc:
        raise ProtocolError(f"unreadable routed_experts in the response: {exc}") from exc


def _choice(data: Any) -> dict[str, Any]:
    try:
        return data["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise ProtocolError(f"response has no choices: {short_repr(data)}") from None


def _tokens(choice: dict[str, Any], *, allow_empty: bool = False) -> tuple[list[int], list[float]]:
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens")
    values = logprobs.get("token_logprobs")
    if allow_empty and not choice.get("token_ids") and not tokens:
        return [], []  # a chunk with no new token (e.g. only the finish reason)
    if tokens is None or values is None:
        raise ProtocolError(
            "response has no per-token logprobs; the request asked for them (logprobs=1): "
            f"{short_repr(choice)}"
        )
    ids = choice.get("token_ids")
    if ids is None:
        ids = []
        for tok in tokens:
            match = _TOKEN_ID.match(str(tok))
            if match is None:
                raise ProtocolError(
                    f"token {tok!r} is not 'token_id:<id>'; the server ignored "
                    f"return_tokens_as_token_ids (vLLM too old?)"
                )
            ids.append(int(match.group(1)))
    if len(ids) != len(values):
        raise ProtocolError(
            f"{len(ids)} token ids but {len(values)} logprobs in {short_repr(choice)}"
        )
    if any(v is None for v in values):
        raise ProtocolError(f"a sampled token has no logprob: {values}")
    return [int(t) for t in ids], [float(v) for v in values]


def error_for(status: int, data: Any, *, prompt_tokens: int, max_context: int) -> Exception:
    """The exception for a 4xx answer: ``ContextOverflow`` when the prompt was too long."""
    message = error_message(data)
    match = _CONTEXT.search(message)
    if match is not None:
        return ContextOverflow(prompt_tokens, int(match.group(1)) or max_context)
    return ValueError(f"vLLM rejected the request (HTTP {status}): {message}")
