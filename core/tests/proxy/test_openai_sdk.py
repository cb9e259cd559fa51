"""The official openai SDK against the proxy, backed by the real embedded engine."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from proxy_support import FINAL_TEXT, OPENAI_TOOLS, SYSTEM, TASK, TOOL_RESULT

pytestmark = pytest.mark.slow


def client(session) -> openai.OpenAI:
    return openai.OpenAI(base_url=session.openai_base_url, api_key="anything", max_retries=0)


def policy_ids(segment) -> list[int]:
    return [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]


def test_non_streaming_chat_is_recorded_exactly(proxy, tiny_engine, session):
    c = client(session)
    r = c.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        temperature=1.0,
        reasoning_effort="low",
        prompt_cache_key="k",
        extra_body={"parallel_tool_calls": False},
    )
    ((prompt, gen),) = tiny_engine.of(session)
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == len(gen.token_ids) <= 8
    assert r.choices[0].finish_reason in ("stop", "length")
    traj = proxy.close_session(session)
    (seg,) = traj.segments
    assert seg.token_ids == (*prompt, *gen.token_ids)
    assert policy_ids(seg) == list(gen.token_ids)
    assert traj.num_calls == 1


def test_tool_round_trip_streaming_and_not(proxy, tiny_engine, session):
    c = client(session)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    r = c.chat.completions.create(
        model="policy", messages=messages, tools=OPENAI_TOOLS, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "ls"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT},
    ]
    with c.chat.completions.stream(
        model="policy",
        messages=messages,
        tools=OPENAI_TOOLS,
        temperature=0,
        stream_options={"include_usage": True},
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert final.choices[0].message.content == FINAL_TEXT == "".join(deltas)
    assert final.usage.prompt_tokens_details.cached_tokens > 0  # the prefix was reused
    calls = tiny_engine.of(session)
    traj = proxy.close_session(session)
    (seg,) = traj.segments
    assert policy_ids(seg) == [t for _, g in calls for t in g.token_ids]
    # the second prompt is the first prompt + the policy's own ids + only the new turn
    (p1, g1), (p2, _) = calls
    assert p2[: len(p1) + len(g1.token_ids)] == (*p1, *g1.token_ids)


def test_raw_stream_chunks_and_done(proxy, session):
    with httpx.stream(
        "POST",
        f"{session.openai_base_url}/chat/completions",
        json={
            "model": "policy",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
            "max_tokens": 4,
            "stream_options": {"include_usage": True},
        },
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in resp.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)


def test_logprobs_are_the_recorded_behaviour_logprobs(proxy, tiny_engine, session):
    r = client(session).chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
    )
    ((_, gen),) = tiny_engine.of(session)
    content = r.choices[0].logprobs.content
    shown = len(gen.token_ids) - (gen.token_ids[-1] == tiny_engine.tokenizer.eos_token_id)
    assert [e.logprob for e in content] == pytest.approx(list(gen.logprobs[:shown]), abs=1e-6)
    assert all(len(e.top_logprobs) == 1 and e.top_logprobs[0].logprob == e.logprob for e in content)


def test_async_client_streams_and_unprefixed_url_takes_the_token_as_key(proxy, session):
    async def run():
        c = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=session.token, max_retries=0)
        stream = await c.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
        )
        text = [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]
        models = await c.models.list()
        await c.close()
        return "".join(text), [m.id for m in models.data]

    text, models = asyncio.run(run())
    assert models == ["policy"]
    traj = proxy.close_session(session)
    assert traj.num_calls == 1 and traj.segments[0].num_policy_tokens >= 1
    assert isinstance(text, str)


def test_sdk_errors_are_typed(proxy, session):
    c = client(session)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="n = 2"):
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], n=2)
    bad = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="not-a-session", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    # and the session still works afterwards
    r = c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].message.role == "assistant"


def test_proxy_serves_from_the_callers_event_loop_beside_other_tasks(tiny_engine):
    """``await proxy.start()`` in a running loop: trial code and the proxy share it."""
    from slr.contracts import SamplingParams
    from slr.proxy import Proxy

    async def run():
        ticks = 0

        async def other_trial_work():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        async with Proxy(tiny_engine, sampling=SamplingParams(max_tokens=4)) as proxy:
            worker = asyncio.create_task(other_trial_work())
            session = proxy.open_session("in-loop")
            c = openai.AsyncOpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
            r = await c.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "Hi"}]
            )
            await c.close()
            worker.cancel()
            traj = proxy.close_session(session)
        return r, traj, ticks

    r, traj, ticks = asyncio.run(run())
    assert r.usage.completion_tokens == traj.segments[0].num_policy_tokens
    assert ticks > 0


def test_streamed_tool_call_deltas_assemble_in_the_sdk(proxy, session):
    """What OpenCode does: always streaming, tool calls arrive as deltas."""
    c = client(session)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    with c.chat.completions.stream(
        model="policy", messages=messages, tools=OPENAI_TOOLS, temperature=0, tool_choice="auto"
    ) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert [(e.name, json.loads(e.arguments)) for e in done] == [("bash", {"command": "ls"})]
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "bash"
    assert choice.message.tool_calls[0].id.startswith("call_")


def test_proxy_sessions_is_the_trials_session_factory(proxy, tmp_path):
    from slr.proxy import ProxySessions

    sessions = ProxySessions(proxy, protocol="openai", transcripts=tmp_path)

    async def trial():
        endpoint, handle = await sessions.open("trial-1")
        c = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        await c.chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        await c.close()
        return await sessions.close(handle), handle

    trajectory, handle = asyncio.run(trial())
    assert trajectory.num_calls == 1 and trajectory.session_id == "trial-1"
    assert handle.termination is None
    assert json.loads((tmp_path / "trial-1" / "proxy.json").read_text())["calls"]
