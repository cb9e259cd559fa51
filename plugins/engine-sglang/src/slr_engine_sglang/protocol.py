"""SGLang's native token-in / token-out wire format: building requests, reading responses.

The request is ``POST /generate`` (SGLang's own API, not the OpenAI one) with
``input_ids`` (the prompt's token ids: no tokenization on the server), ``rid`` (our id
for the request, so ``/abort_request`` can name it), ``sampling_params`` and
``return_logprob: true``. Sampling params use SGLang's names: ``max_new_tokens``,
``sampling_seed``, ``stop`` / ``stop_token_ids``; ``no_stop_trim`` keeps a matched stop
string in the output and ``skip_special_tokens: false`` hides nothing the model
generated. SGLang refuses a request whose prompt plus ``max_new_tokens`` reaches the
context length, so ``max_new_tokens`` is cut to the room left (the generation then ends
with ``length``, as the contract says).

The answer is ``{"text", "output_ids", "meta_info"}``; ``meta_info`` carries
``output_token_logprobs`` as ``[logprob, token_id, text]`` triples, ``finish_reason``
(``None`` until the end, then ``{"type": "stop" | "length" | "abort", ...}``),
``prompt_tokens``, ``completion_tokens``, ``weight_version`` (and, on newer servers,
``weight_versions``: spans of output tokens per version), and with
``return_routed_experts`` the routing as base64 of an int32 array covering positions
``[0, prompt + completion - 1)``: every token the model ran but the last.

Streaming sends the same body with ``stream: true``: server-sent events, each one such
answer, then ``data: [DONE]``. By default SGLang's events are cumulative (every event
repeats the tokens so far); with ``--incremental-streaming-output`` each carries only the
new ones. ``read_output`` handles both by comparing against ``completion_tokens``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from slr.contracts import ContextOverflow, SamplingParams
from slr.contracts.records import FinishReason
from slr.engines.protocol import error_message, short_repr
from slr.errors import UsageError

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
# SGLang's two context errors: the prompt alone, and prompt + max_new_tokens
_CONTEXT = (
    re.compile(r"longer than the model's context length \((\d+) tokens\)", re.IGNORECASE),
    re.compile(r"maximum context length of (\d+) tokens", re.IGNORECASE),
)


class ProtocolError(RuntimeError):
    """The server answered with something that is not an SGLang ``/generate`` answer."""


def check_sampling(sampling: SamplingParams, *, allow_truncated_logprobs: bool) -> None:
    if not allow_truncated_logprobs and (sampling.top_k or sampling.top_p < 1.0):
        raise ValueError(
            f"top_k={sampling.top_k} / top_p={sampling.top_p}: whether SGLang reports the "
            f"log-prob before truncation (log_softmax(logits / temperature), what the trainer "
            f"computes) is not checked for these settings. Use top_k=0 and top_p=1.0, or set "
            f"the engine's allow_truncated_logprobs = true if you accept a possible mismatch."
        )


def generate_request(
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    *,
    rid: str,
    max_new_tokens: int,
    stream: bool = False,
    return_routed_experts: bool = False,
    lora_path: str | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /generate`` for one generation; ``lora_path`` names a loaded
    adapter (SGLang's field takes the name given to ``/load_lora_adapter``)."""
    params: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        # SGLang reads -1 as "the whole vocabulary"
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    body: dict[str, Any] = {
        "rid": rid,
        "input_ids": [int(t) for t in prompt_ids],
        "sampling_params": params,
        "return_logprob": True,
        "logprob_start_len": -1,  # log-probs of the output tokens only
        "stream": stream,
    }
    if return_routed_experts:
        body["return_routed_experts"] = True
    if lora_path is not None:
        body["lora_path"] = lora_path
    return body


@frozen(kw_only=True)
class Piece:
    """What one answer (or streamed event) adds: the new tokens and, at the end, the rest."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason | None
    completion_tokens: int
    # one version per new token when the server reports spans (newer SGLang), else None
    versions: tuple[int, ...] | None = None
    routed_experts: list[Any] | None = None
    message: str = ""  # an abort's reason, as the server gave it


def read_output(data: Any, *, seen: int, prompt_tokens: int, experts_per_token: int = 0) -> Piece:
    """The new tokens in one ``/generate`` answer, given ``seen`` tokens already read."""
    if isinstance(data, dict) and "error" in data:
        raise ProtocolError(f"the server reported an error: {short_repr(data['error'])}")
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise ProtocolError(f"not a /generate answer (no meta_info): {short_repr(data)}")
    meta = data["meta_info"]
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise ProtocolError(
            "answer has no output_token_logprobs; the request asked for them "
            f"(return_logprob=true): {short_repr(meta)}"
        )
    completion = int(meta.get("completion_tokens", seen + len(entries)))
    if len(entries) == completion:  # cumulative (SGLang's default streaming, or one answer)
        new = entries[seen:]
    elif len(entries) == completion - seen:  # --incremental-streaming-output
        new = entries
    else:
        raise ProtocolError(
            f"{len(entries)} log-prob entries do not fit completion_tokens={completion} "
            f"after {seen} tokens already read"
        )
    ids: list[int] = []
    values: list[float] = []
    for entry in new:
        if not isinstance(entry, list | tuple) or len(entry) < 2:
            raise ProtocolError(f"log-prob entry {entry!r} is not [logprob, token_id, text]")
        if entry[0] is None:
            raise ProtocolError(f"a sampled token has no logprob: {entry!r}")
        values.append(float(entry[0]))
        ids.append(int(entry[1]))
    reason = finish_reason(meta.get("finish_reason"))
    routed = None
    if reason is not None and meta.get("routed_experts") is not None:
        routed = decode_routed_experts(
            meta["routed_experts"],
            rows=prompt_tokens + completion - 1,
            experts_per_token=experts_per_token,
        )
    return Piece(
        token_ids=tuple(ids),
        logprobs=tuple(values),
        finish_reason=reason,
        completion_tokens=completion,
        versions=_versions(meta.get("weight_versions"), start=completion - len(new), n=len(new)),
        routed_experts=routed,
        message=abort_message(meta.get("finish_reason")),
    )


def finish_reason(value: Any) -> FinishReason | None:
    """SGLang's ``finish_reason`` (``None``, or ``{"type": ..., ...}``) as the contract's."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else value
    reason = _FINISH.get(str(kind))
    if reason is None:
        raise ProtocolError(f"unknown finish_reason {value!r}")
    return reason


def abort_message(value: Any) -> str:
    return str(value.get("message", "")) if isinstance(value, dict) else ""


def decode_routed_experts(encoded: Any, *, rows: int, experts_per_token: int) -> list[Any]:
    """SGLang's base64 int32 routing as ``[position][layer][k]`` expert ids."""
    if isinstance(encoded, list):  # a server that sends it as nested lists already
        return encoded
    try:
        raw = base64.b64decode(encoded)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"routed_experts is not base64: {exc}") from exc
    if len(raw) % 4:
        raise ProtocolError(f"routed_experts has {len(raw)} bytes, not a whole int32 array")
    flat = memoryview(raw).cast("i").tolist()
    if rows <= 0:
        return []
    per_row, rest = divmod(len(flat), rows)
    k = experts_per_token or per_row
    if rest or per_row % k:
        raise ProtocolError(
            f"routed_experts holds {len(flat)} ids, not {rows} positions x layers x "
            f"{k} experts; set [engine] experts_per_token to the model's num_experts_per_tok"
        )
    return [
        [
            flat[r * per_row + layer * k : r * per_row + (layer + 1) * k]
            for layer in range(per_row // k)
        ]
        for r in range(rows)
    ]


def _versions(spans: Any, *, start: int, n: int) -> tuple[int, ...] | None:
    """Per-token versions for output tokens ``start .. start + n`` from SGLang's spans."""
    if not isinstance(spans, list) or not spans:
        return None
    out: list[int] = []
    try:
        for i in range(start, start + n):
            span = next(s for s in spans if int(s["start"]) <= i < int(s["end"]))
            out.append(int(span["version"]))
    except (StopIteration, KeyError, TypeError, ValueError):
        return None  # versions we did not set (not integers), or spans not covering the tokens
    return tuple(out)


def context_overflow(message: str, *, prompt_tokens: int, max_context: int) -> Exception | None:
    """``ContextOverflow`` when ``message`` is one of SGLang's context-length errors."""
    for pattern in _CONTEXT:
        match = pattern.search(message)
        if match is not None:
            return ContextOverflow(prompt_tokens, int(match.group(1)) or max_context)
    return None


def error_for(status: int, data: Any, *, prompt_tokens: int, max_context: int) -> Exception:
    """The exception for a 4xx answer: ``ContextOverflow`` when the prompt was too long."""
    message = error_message(data)
    overflow = context_overflow(message, prompt_tokens=prompt_tokens, max_context=max_context)
    if overflow is not None:
        return overflow
    return ValueError(f"SGLang rejected the request (HTTP {status}): {message}")


# -- weight updates (request bodies; the answers are {"success", "message"}) ---------------


def init_group_request(
    *,
    master_address: str,
    master_port: int,
    world_size: int,
    group_name: str,
    backend: str,
) -> dict[str, Any]:
    """``POST /init_weights_update_group``: the server's workers join as ranks 1..N."""
    return {
        "master_address": master_address,
        "master_port": master_port,
        "rank_offset": 1,
        "world_size": world_size,
        "group_name": group_name,
        "backend": backend,
    }


def distributed_request(
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    *,
    group_name: str,
    weight_version: int | None,
) -> dict[str, Any]:
    """``POST /update_weights_from_distributed`` for one bucket. Only the last bucket of an
    update names the new version and flushes the prefix cache: the version changes once
    every tensor is in."""
    body: dict[str, Any] = {
        "names": list(names),
        "dtypes": list(dtypes),
        "shapes": [[int(n) for n in shape] for shape in shapes],
        "group_name": group_name,
        "flush_cache": weight_version is not None,
    }
    if weight_version is not None:
        body["weight_version"] = str(weight_version)
    return body


def tensor_request(payload: str, *, ranks: int, weight_version: int | None) -> dict[str, Any]:
    """``POST /update_weights_from_tensor`` for one bucket: the same serialized tensors
    for each of the server's ``ranks`` tensor-parallel workers (each takes its own slice)."""
    body: dict[str, Any] = {
        "serialized_named_tensors": [payload] * ranks,
        "load_format": None,
        "flush_cache": weight_version is not None,
    }
    if weight_version is not None:
        body["weight_version"] = str(weight_version)
    return body


def destroy_group_request(group_name: str) -> dict[str, Any]:
    return {"group_name": group_name}


def server_ranks(info: Any) -> int:
    """The tensor-parallel workers a weight group reaches, from ``GET /get_server_info``
    (SGLang's ``ServerArgs``). SGLang numbers a worker's rank ``rank_offset + tp_rank``, so
    data- or pipeline-parallel servers would collide in one group: those are refused."""
    if not isinstance(info, dict):
        raise ProtocolError(f"/get_server_info did not answer a JSON object: {short_repr(info)}")
    sizes = {k: int(info.get(k) or 1) for k in ("tp_size", "dp_size", "pp_size")}
    if sizes["dp_size"] > 1 or sizes["pp_size"] > 1:
        raise UsageError(
            f"SGLang server has dp_size={sizes['dp_size']}, pp_size={sizes['pp_size']}: its "
            f"weight group numbers workers by tensor-parallel rank only, so they would "
            f"collide; use weight_update = 'disk' for it, or one server per data-parallel "
            f"replica ([engine] replicas)"
        )
    return sizes["tp_size"]


# -- LoRA adapters (answers: {"success", "error_message", "loaded_adapters"}) ---------------


def load_lora_request(name: str, path: str) -> dict[str, Any]:
    """``POST /load_lora_adapter``: read the peft folder at ``path`` as adapter ``name`` (a
    name SGLang does not hold yet: it refuses to load one twice)."""
    return {"lora_name": name, "lora_path": path}


def unload_lora_request(name: str) -> dict[str, Any]:
    """``POST /unload_lora_adapter``: SGLang drops ``name`` once no request uses it."""
    return {"lora_name": name}


def weight_version_request(version: int) -> dict[str, Any]:
    """``POST /update_weight_version``: the version the server reports from now on (an
    adapter load does not change it); running requests are not aborted."""
    return {"new_version": str(version), "abort_all_requests": False}
