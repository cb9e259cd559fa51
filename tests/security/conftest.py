"""Fixtures: a real (tiny) engine behind a live proxy with short client timeouts."""

from __future__ import annotations

import asyncio

import pytest

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
def engine():
    from slr_engine_hf.config import HfEngineConfig
    from slr_engine_hf.engine import HfEngine

    from slr_testkit.tiny import tiny_model, tokenizer

    model, tok = tiny_model(tok=tokenizer(), hidden=64, layers=2, seed=3)
    engine = HfEngine.from_model(model, tok, HfEngineConfig(prefix_cache_tokens=0))
    yield engine
    asyncio.run(engine.close())


#: The proxy's HTTP parsers (``[proxy] http_parser``): every attack meets each of them.
HTTP_PARSERS = ["httptools", "h11"]


@pytest.fixture(scope="session", params=HTTP_PARSERS)
def proxy(engine, request):
    config = ProxySection(
        http_parser=request.param,
        model_names=["policy"],
        max_body_bytes=256 * 1024,
        header_timeout_s=0.5,
        body_timeout_s=1.0,
    )
    proxy = Proxy(engine, config, sampling=SamplingParams(max_tokens=4))
    with ProxyThread(proxy):
        yield proxy
