"""Shared engines: the real SmolLM2 loads once per test session (it is the slow part)."""

from __future__ import annotations

import asyncio

import pytest
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine

from slr_testkit import tiny
from slr_testkit.logprobs import reference_logprobs as fp32_reference


@pytest.fixture(scope="session")
def smollm2():
    engine = HfEngine(HfEngineConfig(max_batch=16))
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def tiny_pair():
    """A tiny random Qwen2 model and the SmolLM2 tokenizer (built in about a second)."""
    return tiny.tiny_model(seed=0)


@pytest.fixture
def tiny_engine(tiny_pair):
    model, tok = tiny_pair
    engine = HfEngine.from_model(model, tok)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def reference_logprobs():
    """``reference_logprobs(model, prompt, tokens, T)``: the trainer's fp32 log-probs."""
    return fp32_reference
