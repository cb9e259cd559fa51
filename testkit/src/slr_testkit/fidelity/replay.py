"""Replaying a scenario through the real proxy with forced decoding, and checking the capture.

``ForcedReplayEngine`` wraps an engine that implements ``slr.contracts.ForcedDecoding``:
each call the proxy makes is answered with the next scripted reply's token ids, scored by
the engine (so its log-probs are the engine's own, exactly as if it had sampled them). The
replay drives the proxy with the official ``openai`` / ``anthropic`` SDKs in the
scaffold's shape, echoing every answer back the way an agent does. Then three checks:

* **captured = generated**: every engine call's prompt + output lies verbatim at the start
  of one recorded segment, with the output's tokens marked as policy tokens, and the
  segments hold no other policy tokens;
* **minimal segments**: the trajectory has exactly as many segments as the template forces:
  one per conversation, plus one wherever the template renders a conversation's next
  request as something other than its previous request and answer followed by new turns
  (Qwen3-style templates drop earlier reasoning once a new user query arrives);
* **re-scoring**: one forward pass over each segment (the trainer's view) gives every
  policy token the behaviour log-prob recorded for it, within ``tolerance``.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from attrs import define, field

from slr.contracts import ForcedDecoding, Generation, GenerationChunk, SamplingParams, Trajectory
from slr.proxy.messages import Message, ToolCall
from slr.proxy.render import Renderer
from slr_testkit.fidelity.scenarios import Call, Reply, Scenario

#: Tokens a family's chat template needs beyond SmolLM2's own (``<|im_start|>`` /
#: ``<|im_end|>``): the Llama-3 headers are special tokens; Qwen3's markup is plain added
#: tokens (so it survives decoding with special tokens skipped, as in Qwen3's tokenizer).
LLAMA3_SPECIAL = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
QWEN3_ADDED = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)


def family_tokenizers(base: Any, templates: dict[str, str | None]) -> dict[str, Any]:
    """One tokenizer per family: ``base`` extended with every family's tokens (one vocabulary,
    so one model serves them all), each with its own chat template (None: ``base``'s)."""
    from tokenizers import AddedToken

    extended = copy.deepcopy(base)
    extended.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_ADDED])
    extended.add_special_tokens({"additional_special_tokens": list(LLAMA3_SPECIAL)})
    out = {}
    for family, template in templates.items():
        tok = copy.deepcopy(extended)
        if template is not None:
            tok.chat_template = template
        out[family] = tok
    return out


@define
class ForcedReplayEngine:
    """An ``Engine`` answering each call with the next scripted reply, forced through ``inner``."""

    inner: Any
    replies: deque[list[int]] = field(factory=deque)
    calls: list[tuple[tuple[int, ...], Generation]] = field(factory=list)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.inner, ForcedDecoding):
            raise TypeError(
                f"{type(self.inner).__name__} has no force_decode; the replay needs an engine "
                f"that implements slr.contracts.ForcedDecoding"
            )

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    @property
    def weights_version(self) -> int:
        return self.inner.weights_version

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id=None
    ) -> Generation:
        if not self.replies:
            raise RuntimeError("the replay made more model calls than its script has replies")
        reply = self.replies.popleft()
        gen = await self.inner.force_decode(prompt_ids, reply, sampling, session_id=session_id)
        self.calls.append((tuple(prompt_ids), gen))
        return gen

    async def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id=None):
        gen = await self.generate(prompt_ids, sampling, session_id=session_id)
        yield GenerationChunk(
            token_ids=gen.token_ids,
            logprobs=gen.logprobs,
            weights_versions=gen.weights_versions,
            routed_experts=gen.routed_experts,
            finish_reason=gen.finish_reason,
            prompt_tokens=gen.prompt_tokens,
        )

    async def update_weights(self, state_dict, *, version=None, mode="drain") -> int:
        return await self.inner.update_weights(state_dict, version=version, mode=mode)

    async def health(self) -> bool:
        return await self.inner.health()

    async def close(self) -> None:
        await self.inner.close()


def reply_ids(tok: Any, family: str, reply: Reply, stop_id: int) -> list[int]:
    """The tokens a model of ``family`` emits for ``reply`` (ending with its stop token).
    Calls use the Hermes syntax the proxy's default parser reads."""
    text = ""
    if family == "qwen3" and reply.reasoning:
        text += f"<think>\n{reply.reasoning}\n</think>\n\n"
    text += reply.text
    if reply.call is not None:
        name, args = reply.call
        body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
        text += ("\n" if reply.text else "") + f"<tool_call>\n{body}\n</tool_call>"
    return [*tok.encode(text, add_special_tokens=False), stop_id]


@define
class CellResult:
    scaffold: str
    family: str
    calls: int = 0
    segments: int = 0
    minimum: int = 0
    policy_tokens: int = 0
    captured_mismatches: int = 0
    max_logprob_error: float = 0.0
    not_applicable: dict[str, str] = field(factory=dict)
    error: str | None = None

    def green(self, tolerance: float = 1e-4) -> bool:
        return (
            self.error is None
            and self.captured_mismatches == 0
            and self.segments == self.minimum
            and self.max_logprob_error <= tolerance
        )


# -- the scaffold side: requests in each API's shape, answers back into messages ------------


def _openai_messages(system: str, msgs: list[Message]) -> list[dict[str, Any]]:
    out = [{"role": "system", "content": system}] if system else []
    return out + [m.as_openai() for m in msgs]


def _anthropic_messages(msgs: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in msgs:
        if m.role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = (
                [{"type": "text", "text": m.content}] if m.content else []
            )
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in m.tool_calls
            ]
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _call_openai(client: Any, scenario: Scenario, system: str, msgs, tools) -> Message:
    kwargs: dict[str, Any] = {
        "model": "policy",
        "messages": _openai_messages(system, msgs),
        "temperature": 1.0,
    }
    if tools:
        kwargs["tools"] = [t.as_openai() for t in tools]
    if not scenario.stream:
        r = client.chat.completions.create(**kwargs).choices[0].message
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=json.loads(c.function.arguments))
            for c in (r.tool_calls or [])
        )
        return Message(role="assistant", content=r.content or "", tool_calls=calls)
    text, parts = "", {}
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for c in delta.tool_calls or []:
            part = parts.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
            part["id"] = c.id or part["id"]
            if c.function is not None:
                part["name"] += c.function.name or ""
                part["arguments"] += c.function.arguments or ""
    calls = tuple(
        ToolCall(id=p["id"], name=p["name"], arguments=json.loads(p["arguments"] or "{}"))
        for _, p in sorted(parts.items())
    )
    return Message(role="assistant", content=text, tool_calls=calls)


def _call_anthropic(client: Any, scenario: Scenario, system: str, msgs, tools) -> Message:
    kwargs: dict[str, Any] = {
        "model": "policy",
        "max_tokens": 1024,
        "messages": _anthropic_messages(msgs),
    }
    if system:
        kwargs["system"] = system
    if tools:
        kwargs["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in tools
        ]
    if scenario.stream:
        with client.messages.stream(**kwargs) as s:
            message = s.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    text = "".join(b.text for b in message.content if b.type == "text")
    calls = tuple(
        ToolCall(id=b.id, name=b.name, arguments=dict(b.input))
        for b in message.content
        if b.type == "tool_use"
    )
    return Message(role="assistant", content=text, tool_calls=calls)


# -- the replay and its checks ------------------------------------------------------------------


def replay(
    scenario: Scenario,
    family: str,
    engine: Any,
    score: Callable[[list[int], list[int]], list[float]],
    *,
    tolerance: float = 1e-4,
) -> CellResult:
    """Run ``scenario`` through a fresh proxy over ``engine`` (a ``ForcedDecoding`` engine
    whose tokenizer carries ``family``'s template) and check the capture.
    ``score(ids, positions)`` returns ``log p(ids[j] | ids[:j])`` for each ``j`` in
    ``positions``: the trainer's forward pass."""
    import anthropic
    import openai

    from slr.config import ProxySection
    from slr.proxy import Proxy, ProxyThread

    result = CellResult(scaffold=scenario.scaffold, family=family)
    result.not_applicable = {k: v for k, v in scenario.features.items() if v is not None}
    forced = ForcedReplayEngine(engine)
    proxy = Proxy(
        forced,
        ProxySection(client_sampling="honor"),
        sampling=SamplingParams(temperature=1.0, max_tokens=1024),
    )
    renderer: Renderer = proxy.renderer
    tok = engine.tokenizer
    stop_id = min(renderer.stop_token_ids - {tok.eos_token_id} or {tok.eos_token_id})
    convos: dict[str, list[Message]] = {name: [] for name in scenario.conversations}
    previous: dict[str, str] = {}  # each conversation's last request + answer, rendered
    with ProxyThread(proxy):
        session = proxy.open_session(f"{scenario.scaffold}-{family}")
        if scenario.api == "openai":
            client: Any = openai.OpenAI(
                base_url=session.openai_base_url, api_key=session.token, max_retries=0
            )
            send = _call_openai
        else:
            client = anthropic.Anthropic(
                base_url=session.anthropic_base_url, api_key=session.token, max_retries=0
            )
            send = _call_anthropic
        try:
            for call in scenario.calls:
                spec = scenario.conversations[call.convo]
                msgs = convos[call.convo]
                _add(msgs, call)
                forced.replies.append(reply_ids(tok, family, call.reply, stop_id))
                answer = send(client, scenario, spec.system, msgs, spec.tools)
                full = ([Message(role="system", content=spec.system)] if spec.system else []) + msgs
                now = renderer.render(full, spec.tools, generation_prompt=True)
                if call.convo not in previous or not now.startswith(previous[call.convo]):
                    result.minimum += 1
                msgs.append(answer)
                full.append(answer)
                previous[call.convo] = renderer.render(full, spec.tools, generation_prompt=False)
                result.calls += 1
        except Exception as exc:  # a cell that fails says how, the others still run
            result.error = f"{type(exc).__name__}: {exc}"
        trajectory = proxy.close_session(session)
    _check(result, trajectory, forced.calls, score)
    return result


def _add(msgs: list[Message], call: Call) -> None:
    for kind, text in call.add:
        if kind == "user":
            msgs.append(Message(role="user", content=text))
            continue
        last = next((m for m in reversed(msgs) if m.role == "assistant"), None)
        if last is None or not last.tool_calls:
            raise ValueError(f"scenario adds a tool result in {call.convo!r} without a call")
        msgs.append(Message(role="tool", content=text, tool_call_id=last.tool_calls[0].id))


def _check(
    result: CellResult,
    trajectory: Trajectory,
    calls: list[tuple[tuple[int, ...], Generation]],
    score: Callable[[list[int], list[int]], list[float]],
) -> None:
    segments = trajectory.segments
    result.segments = len(segments)
    claimed = [[False] * len(s.token_ids) for s in segments]
    for prompt, gen in calls:
        whole = [*prompt, *gen.token_ids]
        found = False
        for i, seg in enumerate(segments):
            if list(seg.token_ids[: len(whole)]) == whole and all(
                seg.loss_mask[len(prompt) : len(whole)]
            ):
                for j in range(len(prompt), len(whole)):
                    claimed[i][j] = True
                found = True
                break
        if not found:
            result.captured_mismatches += 1
    for i, seg in enumerate(segments):
        policy = [j for j, m in enumerate(seg.loss_mask) if m]
        result.policy_tokens += len(policy)
        result.captured_mismatches += sum(1 for j in policy if not claimed[i][j])
        if policy:
            rescored = score(list(seg.token_ids), policy)
            worst = max(abs(r - seg.logprobs[j]) for r, j in zip(rescored, policy, strict=True))
            result.max_logprob_error = max(result.max_logprob_error, worst)


def run_matrix(
    scenarios: Sequence[Scenario],
    engines: dict[str, Any],
    score: Callable[[list[int], list[int]], list[float]],
) -> list[CellResult]:
    """Every scenario under every family (``engines``: family -> ForcedDecoding engine)."""
    return [
        replay(s, family, engine, score) for s in scenarios for family, engine in engines.items()
    ]


def markdown_table(results: Sequence[CellResult], families: Sequence[str]) -> str:
    """The matrix as a Markdown table: one row per scaffold, one column per family."""
    rows = {}
    for r in results:
        rows.setdefault(r.scaffold, {})[r.family] = r
    lines = [
        "| scaffold | " + " | ".join(families) + " | N/A (why) |",
        "| --- | " + " | ".join("---" for _ in families) + " | --- |",
    ]
    for scaffold, cells in rows.items():
        shown = []
        for f in families:
            r = cells[f]
            shown.append(
                f"{'ok' if r.green() else 'FAIL'}: {r.segments} seg (min {r.minimum}), "
                f"{r.calls} calls, {r.policy_tokens} tok, err {r.max_logprob_error:.0e}"
                + (f", {r.error}" if r.error else "")
            )
        by_reason: dict[str, list[str]] = {}
        for name, why in next(iter(cells.values())).not_applicable.items():
            by_reason.setdefault(why, []).append(name)
        na = "; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items())
        lines.append(f"| {scaffold} | " + " | ".join(shown) + f" | {na or '-'} |")
    return "\n".join(lines)
