"""Streaming with tool calls: the text before a tool call streams, the call is held back from
its parser's start marker and sent whole once parsed, and the trajectory the proxy captures
is the same whether the agent streamed or not. Both APIs, official SDKs; Hermes and one of
verl's parsers (qwen3_coder, whose call is XML under the same ``<tool_call>`` marker).

The engine is scripted (``ScriptedEngineStub``): each session's first answer is a sentence
and then the parser's tool call, token by token; the second (after the tool result) is a
plain sentence. The proxy, the SDKs and the parsers are the real ones.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest
from proxy_support import BASH, OPENAI_TOOLS, SYSTEM, TOOL_RESULT

from slr.config import ProxySection
from slr.contracts import GenerationChunk, SamplingParams
from slr.contracts.engine import ChunkCollector
from slr.proxy import Proxy, ProxyThread
from slr.proxy.messages import ToolCall
from slr.proxy.toolparse import get_tool_parser

pytestmark = pytest.mark.timeout(60)

PARSERS = ["hermes", "qwen3_coder"]
BEFORE = "Let me look."
FINAL = "The directory holds a.txt."
CALL = ToolCall(id="x", name="bash", arguments={"command": "ls"})
ANTHROPIC_TOOLS = [
    {"name": "bash", "description": BASH.description, "input_schema": BASH.parameters}
]


def _task(parser: str) -> str:
    return f"List the files ({parser})."


def _call_text(parser: str) -> str:
    """The sentence, then the call in the parser's own syntax."""
    return get_tool_parser(parser).render_calls(BEFORE, [CALL])


class ScriptedEngineStub:
    """Stands in for a model taught to answer each session's first call with ``first`` and
    its second with ``then``, one token per chunk, with fixed log-probs.

    Teaching a tiny model both parsers' calls takes minutes of CPU on a shared 2-core machine,
    and the proxy is what is under test here: what it streams, holds back and records. The
    real engine streaming through the proxy is core/tests/proxy/test_live_stream.py.
    """

    def __init__(self, tok, first: str, then: str) -> None:
        self.tokenizer = tok
        self.max_context = 4096
        self.weights_version = 0
        self.answers = [
            [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
            for text in (first, then)
        ]
        self.calls: dict[str | None, int] = {}

    async def stream(self, prompt_ids, sampling, *, session_id=None):
        turn = self.calls.get(session_id, 0)
        self.calls[session_id] = turn + 1
        ids = self.answers[min(turn, 1)]
        for i, token in enumerate(ids):
            await asyncio.sleep(0)  # a token boundary: let the proxy send what it has
            yield GenerationChunk(
                token_ids=(token,),
                logprobs=(-0.01 * (i + 1),),
                weights_versions=(0,),
                finish_reason="stop" if i == len(ids) - 1 else None,
                prompt_tokens=len(prompt_ids),
            )

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        collector = ChunkCollector()
        async for chunk in self.stream(prompt_ids, sampling, session_id=session_id):
            collector.add(chunk)
        return collector.generation()

    async def update_weights(self, state_dict, *, version=None, mode="drain"):
        raise NotImplementedError

    async def health(self):
        return True

    async def close(self):
        pass


@pytest.fixture(scope="module", params=PARSERS)
def parser_proxy(request, smol_tokenizer):
    engine = ScriptedEngineStub(smol_tokenizer, _call_text(request.param), FINAL)
    config = ProxySection(
        model_names=["policy"], client_sampling="honor", tool_parser=request.param
    )
    proxy = Proxy(engine, config, sampling=SamplingParams(max_tokens=24))
    with ProxyThread(proxy):
        yield request.param, proxy


def _same(a, b) -> None:
    assert len(a.segments) == len(b.segments) == 1
    (x,), (y,) = a.segments, b.segments
    assert x.token_ids == y.token_ids
    assert x.loss_mask == y.loss_mask
    assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    assert a.num_calls == b.num_calls == 2


def _openai_conversation(proxy, name: str, stream: bool):
    session = proxy.open_session(f"openai-{name}-{stream}")
    c = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _task(name)}]
    kw = dict(model="policy", tools=OPENAI_TOOLS)
    deltas: list[tuple[str, object]] = []
    if stream:
        for chunk in c.chat.completions.create(messages=messages, stream=True, **kw):
            for choice in chunk.choices:
                if choice.delta.content:
                    deltas.append(("text", choice.delta.content))
                for tc in choice.delta.tool_calls or []:
                    if tc.function and tc.function.arguments:
                        deltas.append(("args", tc.function.arguments))
        content = "".join(d for kind, d in deltas if kind == "text")
        calls = [
            ToolCall(id="c1", name="bash", arguments=json.loads(d))
            for k, d in deltas
            if k == "args"
        ]
        assistant = {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": c.arguments_json},
                }
                for c in calls
            ],
        }
    else:
        r = c.chat.completions.create(messages=messages, **kw)
        assistant = r.choices[0].message.model_dump(exclude_none=True)
    messages += [
        assistant,
        {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": TOOL_RESULT},
    ]
    if stream:
        list(c.chat.completions.create(messages=messages, stream=True, **kw))
    else:
        c.chat.completions.create(messages=messages, **kw)
    return proxy.close_session(session), deltas


def test_openai_streams_the_text_holds_the_call_and_captures_the_same(parser_proxy):
    name, proxy = parser_proxy
    streamed, deltas = _openai_conversation(proxy, name, stream=True)
    plain, _ = _openai_conversation(proxy, name, stream=False)
    kinds = [k for k, _ in deltas]
    # the sentence first, as text; nothing of the call's markup ever in the text
    assert kinds[0] == "text" and "".join(d for k, d in deltas if k == "text").strip() == BEFORE
    assert not any("<" in d for k, d in deltas if k == "text")
    # then the call, whole: one arguments delta that parses, after every text delta
    assert kinds.count("args") == 1 and kinds[-1] == "args"
    assert json.loads(deltas[-1][1]) == {"command": "ls"}
    _same(streamed, plain)


def _anthropic_conversation(proxy, name: str, stream: bool):
    session = proxy.open_session(f"anthropic-{name}-{stream}")
    messages: list[dict] = [{"role": "user", "content": _task(name)}]
    body = dict(model="policy", max_tokens=24, system=SYSTEM, tools=ANTHROPIC_TOOLS)
    events: list[dict] = []
    if stream:
        with httpx.stream(
            "POST",
            f"{session.anthropic_base_url}/v1/messages",
            json={**body, "messages": messages, "stream": True},
            headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
            timeout=60,
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        text = "".join(
            e["delta"]["text"] for e in events if e.get("delta", {}).get("type") == "text_delta"
        )
        uses = [
            e["content_block"]
            for e in events
            if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
        ]
        args = [
            e["delta"]["partial_json"]
            for e in events
            if e.get("delta", {}).get("type") == "input_json_delta"
        ]
        content = [{"type": "text", "text": text}] + [
            {"type": "tool_use", "id": u["id"], "name": u["name"], "input": json.loads(a)}
            for u, a in zip(uses, args, strict=True)
        ]
    else:
        c = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="k", max_retries=0)
        m = c.messages.create(messages=messages, **body)
        content = [b.model_dump(exclude_none=True) for b in m.content]
    use = next(b for b in content if b["type"] == "tool_use")
    messages += [
        {"role": "assistant", "content": content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": TOOL_RESULT}],
        },
    ]
    c = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="k", max_retries=0)
    if stream:
        with c.messages.stream(messages=messages, **body) as s:
            s.get_final_message()
    else:
        c.messages.create(messages=messages, **body)
    return proxy.close_session(session), events


def test_anthropic_streams_the_text_holds_the_call_and_captures_the_same(parser_proxy):
    name, proxy = parser_proxy
    streamed, events = _anthropic_conversation(proxy, name, stream=True)
    plain, _ = _anthropic_conversation(proxy, name, stream=False)
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    kinds = [d["type"] for d in deltas]
    texts = [d["text"] for d in deltas if d["type"] == "text_delta"]
    assert kinds[0] == "text_delta" and "".join(texts).strip() == BEFORE
    assert not any("<" in t for t in texts)
    assert kinds.count("input_json_delta") == 1 and kinds[-1] == "input_json_delta"
    assert json.loads(deltas[-1]["partial_json"]) == {"command": "ls"}
    _same(streamed, plain)
