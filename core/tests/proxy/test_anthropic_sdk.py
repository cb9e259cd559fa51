"""The official anthropic SDK against the proxy, backed by the real embedded engine."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import pytest
from proxy_support import ANTHROPIC_TOOLS, FINAL_TEXT, SYSTEM, TASK, TOOL_RESULT

pytestmark = pytest.mark.slow

CLAUDE_CODE_EXTRAS = {
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "metadata": {"user_id": "u"},
    "extra_headers": {"anthropic-beta": "interleaved-thinking-2025-05-14,context-management"},
    "extra_query": {"beta": "true"},
    "output_config": {"effort": "low"},
    "cache_control": {"type": "ephemeral"},
    # this SDK version has no sampling arguments; clients still send them
    "extra_body": {"temperature": 0, "context_management": {"edits": []}},
}


def client(session) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=session.anthropic_base_url, api_key="anything", max_retries=0
    )


def policy_ids(segment) -> list[int]:
    return [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]


def test_tool_round_trip_with_what_claude_code_sends(proxy, tiny_engine, session):
    c = client(session)
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    m = c.messages.create(
        model="policy",
        max_tokens=64,
        system=system,
        messages=messages,
        tools=ANTHROPIC_TOOLS,
        **CLAUDE_CODE_EXTRAS,
    )
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("bash", {"command": "ls"})
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": TOOL_RESULT}],
        },
    ]
    with c.messages.stream(
        model="policy",
        max_tokens=64,
        system=system,
        messages=messages,
        tools=ANTHROPIC_TOOLS,
        extra_body={"temperature": 0},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == FINAL_TEXT == text
    assert final.stop_reason == "end_turn"
    assert final.usage.cache_read_input_tokens > 0
    calls = tiny_engine.of(session)
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == len(calls[1][0])
    traj = proxy.close_session(session)
    (seg,) = traj.segments
    assert policy_ids(seg) == [t for _, g in calls for t in g.token_ids]


def test_streamed_tool_use_has_input_json_deltas(proxy, session):
    events = []
    with httpx.stream(
        "POST",
        f"{session.anthropic_base_url}/v1/messages?beta=true",
        headers={"anthropic-version": "2023-06-01", "x-api-key": "k"},
        json={
            "model": "policy",
            "max_tokens": 64,
            "stream": True,
            "temperature": 0,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": TASK}],
            "tools": ANTHROPIC_TOOLS,
        },
    ) as resp:
        name = None
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name
                events.append(data)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1]["content_block"]["type"] == "tool_use"
    assert events[2]["delta"]["type"] == "input_json_delta"
    assert json.loads(events[2]["delta"]["partial_json"]) == {"command": "ls"}
    assert events[4]["delta"]["stop_reason"] == "tool_use"


def test_system_role_inside_messages_and_count_tokens(proxy, tiny_engine, session):
    c = client(session)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Reminder: be brief."},
        {"role": "user", "content": "Again"},
    ]
    counted = c.messages.count_tokens(model="policy", messages=messages, system="S")
    m = c.messages.create(model="policy", max_tokens=4, messages=messages, system="S")
    ((prompt, _),) = tiny_engine.of(session)
    assert counted.input_tokens == len(prompt) == m.usage.input_tokens
    assert "Reminder: be brief." in tiny_engine.tokenizer.decode(prompt)


def test_async_stream_helper_and_header_token(proxy, session):
    async def run():
        c = anthropic.AsyncAnthropic(base_url=proxy.url, api_key=session.token, max_retries=0)
        async with c.messages.stream(
            model="policy", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            message = await stream.get_final_message()
        await c.close()
        return message

    message = asyncio.run(run())
    assert message.usage.output_tokens >= 1
    assert proxy.close_session(session).num_calls == 1


def test_sdk_errors_are_typed(proxy, session):
    c = client(session)
    with pytest.raises(anthropic.NotFoundError, match="not served here"):
        c.messages.create(
            model="claude-x", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.BadRequestError, match="image"):
        c.messages.create(
            model="policy",
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )
    proxy.close_session(session)
    with pytest.raises(anthropic.AuthenticationError, match="this session is closed"):
        c.messages.create(model="policy", max_tokens=4, messages=[{"role": "user", "content": "x"}])


def test_stop_sequence_cuts_the_text_but_not_the_capture(proxy, tiny_engine, session):
    c = client(session)
    messages = [{"role": "user", "content": TASK}]
    first = c.messages.create(
        model="policy",
        max_tokens=64,
        system=SYSTEM,
        messages=messages,
        tools=ANTHROPIC_TOOLS,
        extra_body={"temperature": 0},
    )
    (use,) = [b for b in first.content if b.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": TOOL_RESULT}],
        },
    ]
    m = c.messages.create(
        model="policy",
        max_tokens=64,
        system=SYSTEM,
        messages=messages,
        tools=ANTHROPIC_TOOLS,
        stop_sequences=["holds"],
        extra_body={"temperature": 0},
    )
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "holds")
    assert m.content[0].text == FINAL_TEXT[: FINAL_TEXT.index("holds")]
    calls = tiny_engine.of(session)
    (seg,) = proxy.close_session(session).segments
    assert policy_ids(seg) == [t for _, g in calls for t in g.token_ids]
    assert "holds" in tiny_engine.tokenizer.decode(calls[1][1].token_ids)


def test_image_in_a_tool_result_becomes_a_placeholder(proxy, tiny_engine, session):
    c = client(session)
    c.messages.create(
        model="policy",
        max_tokens=2,
        messages=[
            {"role": "user", "content": "look"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "screenshot:"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "iVBO",
                                },
                            },
                        ],
                    }
                ],
            },
        ],
        tools=ANTHROPIC_TOOLS,
    )
    ((prompt, _),) = tiny_engine.of(session)
    assert "screenshot:\n[image block omitted" in tiny_engine.tokenizer.decode(prompt)
