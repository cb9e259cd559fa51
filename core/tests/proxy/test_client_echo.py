"""What a client legitimately echoes back of the proxy's reply extends the segment; a reply the
client drops from its history (mini-swe-agent on a format error) starts a new one.

The request shapes are mini-swe-agent 2.4.6's (text-based actions, through litellm), as it
sent them to a recording server: the assistant reply comes back as ``{"content", "role"}``
with the content byte for byte. Other clients strip whitespace, send content as text parts,
or add fields of their own SDK's message object; none of that changes what the model saw.
"""

from __future__ import annotations

import asyncio
import itertools

import openai
import pytest

from slr.config import ProxySection
from slr.contracts import SamplingParams
from slr.proxy import Proxy, ProxyThread

pytestmark = pytest.mark.slow

SYSTEM = "You are a Linux shell expert. Answer with exactly one bash command in a ```bash block."
TASK = "Task: Create a file named `list.txt` containing the word `fish`.\nAnswer:"
OBSERVATION = "<returncode>0</returncode>\n<output>\n</output>"


@pytest.fixture(scope="module")
def echo_proxy(smol_tokenizer):
    from proxy_support import RecordingEngine
    from slr_engine_hf.engine import HfEngine

    from slr_testkit.tiny import tiny_model

    model, tok = tiny_model(tok=smol_tokenizer, seed=3)
    engine = RecordingEngine(HfEngine.from_model(model, tok))
    proxy = Proxy(engine, ProxySection(), sampling=SamplingParams(max_tokens=12))
    with ProxyThread(proxy):
        yield proxy
    asyncio.run(engine.close())


def _reply(client, messages) -> str:
    r = client.chat.completions.create(model="policy", messages=messages)
    return r.choices[0].message.content or ""


# How the reply comes back in the next request: mini's exact shape, then other clients'.
ECHOES = {
    "mini-swe-agent": lambda text: {"content": text, "role": "assistant"},
    "stripped": lambda text: {"role": "assistant", "content": text.strip()},
    "text-parts": lambda text: {"role": "assistant", "content": [{"type": "text", "text": text}]},
    "sdk-fields": lambda text: {
        "role": "assistant",
        "content": text,
        "tool_calls": None,
        "function_call": None,
        "refusal": None,
        "annotations": [],
        "audio": None,
        "provider_specific_fields": {},
    },
}


@pytest.mark.parametrize("echo", sorted(ECHOES))
def test_an_echoed_reply_extends_the_segment(echo_proxy, echo):
    proxy, engine = echo_proxy, echo_proxy.engine
    session = proxy.open_session(f"echo-{echo}")
    c = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for _ in range(3):
        text = _reply(c, messages)
        messages += [ECHOES[echo](text), {"role": "user", "content": OBSERVATION}]
    calls = engine.of(session)
    traj = proxy.close_session(session)
    assert len(traj.segments) == 1, f"{echo}: the echoed history was judged rewritten"
    (seg,) = traj.segments
    # every call's prompt is the previous prompt plus exactly the tokens the engine generated
    for (p_prev, g_prev), (p_next, _) in itertools.pairwise(calls):
        assert p_next[: len(p_prev) + len(g_prev.token_ids)] == (*p_prev, *g_prev.token_ids)
    assert sum(seg.loss_mask) == sum(len(g.token_ids) for _, g in calls)


def test_a_dropped_reply_starts_a_new_segment(echo_proxy):
    """mini-swe-agent on a format error keeps the reply out of its history and adds its error
    message instead: the next prompt is not the one the policy continued, so a new segment."""
    proxy, engine = echo_proxy, echo_proxy.engine
    session = proxy.open_session("format-error")
    c = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    _reply(c, messages)
    messages.append({"role": "user", "content": "Answer with exactly one bash command."})
    _reply(c, messages)
    calls = engine.of(session)
    traj = proxy.close_session(session)
    assert len(traj.segments) == 2
    assert [
        list(s.token_ids[: len(p)]) for s, (p, _) in zip(traj.segments, calls, strict=True)
    ] == [list(p) for p, _ in calls]
