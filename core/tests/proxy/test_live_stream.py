"""Live streaming through the proxy: deltas while the engine still generates, and a
client that goes away cancels the engine's sequence. Official SDKs, a real (tiny) engine.

The engine is an untaught tiny model: it samples essentially random tokens, so with a
large ``max_tokens`` its generations run long and never end early on EOS. Assertions are
on the engine's own state (its sequence in flight, its cancellation counter), never on time.
"""

from __future__ import annotations

import asyncio
import time

import anthropic
import openai
import pytest

from slr.config import ProxySection
from slr.contracts import SamplingParams
from slr.proxy import Proxy, ProxyThread

LONG = 1500


@pytest.fixture(scope="module")
def engine(smol_tokenizer):
    from slr_engine_hf.engine import HfEngine

    from slr_testkit.tiny import tiny_model

    model, tok = tiny_model(tok=smol_tokenizer, hidden=64, layers=2, seed=3)
    engine = HfEngine.from_model(model, tok)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="module")
def live_proxy(engine):
    config = ProxySection(model_names=["policy"], client_sampling="honor")
    proxy = Proxy(engine, config, sampling=SamplingParams(max_tokens=LONG))
    with ProxyThread(proxy):
        yield proxy


def _wait_for(condition) -> None:
    """Poll the engine's state (bounded) until ``condition()`` holds."""
    for _ in range(20_000):
        if condition():
            return
        time.sleep(0.001)
    raise AssertionError("the engine never reached the expected state")


MESSAGES = [{"role": "user", "content": "Write a long story."}]


def test_openai_deltas_arrive_while_the_engine_generates(live_proxy, engine):
    session = live_proxy.open_session("live-openai")
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
    before = engine.stats()["generated_tokens"]
    in_flight_at_first_delta = None
    text = []
    stream = client.chat.completions.create(
        model="policy", messages=MESSAGES, max_tokens=LONG, temperature=1.0, seed=1, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if in_flight_at_first_delta is None:
                stats = engine.stats()
                in_flight_at_first_delta = (stats["load"], stats["generated_tokens"] - before)
            text.append(chunk.choices[0].delta.content)
    traj = live_proxy.close_session(session)
    load, generated = in_flight_at_first_delta  # type: ignore[misc]
    assert load == 1 and generated < LONG  # the sequence was still being generated
    # the call's timing says when its first token came, long before its last
    (call,) = live_proxy.transcript(session)["calls"]
    timing = call["timing_ms"]
    assert 0 <= timing["first_token"] < timing["engine"] / 10
    (seg,) = traj.segments
    policy = [t for t, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m]
    assert len(policy) == LONG  # ran to its end; capture aligned, nothing re-tokenized
    assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs)
    shown = engine.tokenizer.decode(policy, skip_special_tokens=True)
    assert "".join(text) == shown


def test_openai_client_closing_early_cancels_the_generation(live_proxy, engine):
    session = live_proxy.open_session("close-openai")
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
    cancelled = engine.stats()["cancelled"]
    stream = client.chat.completions.create(
        model="policy", messages=MESSAGES, max_tokens=LONG, seed=2, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            assert engine.stats()["load"] == 1
            break
    stream.close()
    _wait_for(lambda: engine.stats()["cancelled"] == cancelled + 1)
    _wait_for(lambda: engine.stats()["load"] == 0)
    # nothing of the abandoned call is recorded, and the session goes on exactly
    reply = client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=3)
    traj = live_proxy.close_session(session)
    (seg,) = traj.segments
    assert traj.num_calls == 1 and sum(seg.loss_mask) == reply.usage.completion_tokens == 3


def test_anthropic_stream_deltas_then_early_close_cancels(live_proxy, engine):
    session = live_proxy.open_session("close-anthropic")
    client = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="k", max_retries=0)
    cancelled = engine.stats()["cancelled"]
    with client.messages.stream(model="policy", messages=MESSAGES, max_tokens=LONG) as stream:
        for text in stream.text_stream:
            if text:
                assert engine.stats()["load"] == 1  # streamed while still generating
                break
    _wait_for(lambda: engine.stats()["cancelled"] == cancelled + 1)
    _wait_for(lambda: engine.stats()["load"] == 0)
    traj = live_proxy.close_session(session)
    assert traj.segments == () and traj.num_calls == 0
