"""Shared engines: the real SmolLM2 loads once per test session (it is the slow part)."""

from __future__ import annotations

import asyncio

import pytest
from slr_engine_hf import tiny
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine


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


def _reference_logprobs(model, prompt, tokens, temperature: float) -> list[float]:
    """The trainer's view: log_softmax(logits / T) per completion token from one fp32
    forward pass over prompt + completion (T = 0 reads as 1)."""
    import torch

    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    t = temperature if temperature > 0 else 1.0
    lp = torch.log_softmax(logits / t, dim=-1)
    start = len(prompt) - 1
    return [float(lp[start + i, tok]) for i, tok in enumerate(tokens)]


@pytest.fixture(scope="session")
def reference_logprobs():
    return _reference_logprobs
