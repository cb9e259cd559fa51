"""Fixtures: a real (tiny) engine whose decode steps take as long as a real model's on a
CPU, behind a live proxy.

The tiny model computes a step in well under a millisecond, faster than any client can be
seen leaving; a forward hook gives every forward pass a floor of ``STEP_S`` (it waits, it
does not burn a core), so "the engine stopped within one decode step of the disconnect"
is a statement about the proxy, not about scheduling noise.
"""

from __future__ import annotations

import asyncio

import pytest
from reliability_support import LONG, STEP_S, slow_steps

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
def slow_engine():
    from slr_engine_hf.engine import HfEngine

    from slr_testkit.tiny import tiny_model, tokenizer

    model, tok = tiny_model(tok=tokenizer(), hidden=64, layers=2, seed=3)
    slow_steps(model, STEP_S)
    engine = HfEngine.from_model(model, tok)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def proxy_thread(slow_engine):
    """The proxy on its own loop; ``proxy_thread.call(coro)`` runs ``coro`` on that loop."""
    config = ProxySection(model_names=["policy"], client_sampling="honor")
    proxy = Proxy(slow_engine, config, sampling=SamplingParams(max_tokens=LONG))
    thread = ProxyThread(proxy)
    with thread:
        yield thread


@pytest.fixture(scope="session")
def live_proxy(proxy_thread):
    return proxy_thread.proxy
