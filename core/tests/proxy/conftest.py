"""Fixtures: real engines (a tiny model taught a tool call, and SmolLM2) behind a live proxy.

The proxy runs in a ``ProxyThread`` for the whole test session, so tests are plain
functions that use the official SDKs' synchronous clients (and ``asyncio.run`` for the
async ones). ``RecordingEngine`` passes every call through to the real engine and keeps
what it was given and what it generated, so tests compare the proxy's capture with the
engine's own output.
"""

from __future__ import annotations

import asyncio

import pytest
from proxy_support import RecordingEngine, teach_completions, tool_prompts

from slr.config import ProxySection
from slr.contracts import SamplingParams
from slr.proxy import Proxy, ProxyThread


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Two cores shared by many processes: more torch threads only add contention."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (ChatML template, no native tool support)."""
    from slr_testkit.tiny import tokenizer

    return tokenizer()


@pytest.fixture(scope="session")
def tiny_engine(smol_tokenizer):
    """A tiny random qwen2 model, taught in the fixture to make the bash tool call."""
    from slr_engine_hf.engine import HfEngine

    from slr_testkit.tiny import tiny_model

    model, tok = tiny_model(tok=smol_tokenizer, hidden=64, layers=2)
    loss = teach_completions(model, tok, tool_prompts(tok))
    assert loss < 0.2, f"the tiny model did not learn the tool call (loss {loss})"
    engine = RecordingEngine(HfEngine.from_model(model, tok))
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def proxy(tiny_engine):
    config = ProxySection(
        max_body_bytes=256 * 1024, model_names=["policy"], client_sampling="honor"
    )
    proxy = Proxy(tiny_engine, config, sampling=SamplingParams(max_tokens=64))
    with ProxyThread(proxy):
        yield proxy


@pytest.fixture
def session(proxy, request):
    s = proxy.open_session(request.node.name)
    yield s
    proxy.close_session(s)
