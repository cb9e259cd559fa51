"""HfEngine streaming, cancellation and partial weight updates (tiny real models)."""

from __future__ import annotations

import asyncio
import contextlib
import copy

import pytest
import torch
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine

from slr.contracts import SamplingParams, collect
from slr_testkit import tiny

PROMPT = list(range(100, 130))


async def _until(condition, limit: int = 100_000) -> None:
    """Yield to the loop until ``condition()`` holds (engine state, not wall time)."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


def test_stream_equals_generate_chunk_by_chunk(tiny_pair):
    # No shared-prefix cache: the second request would reuse the first's prompt KV, which
    # is exact only to float summation order (1e-4), and this compares bit for bit.
    engine = HfEngine.from_model(*tiny_pair, HfEngineConfig(prefix_cache_tokens=0))
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7)

    async def run():
        chunks = [c async for c in engine.stream(PROMPT, params, session_id="s1")]
        gen = await engine.generate(PROMPT, params, session_id="s2")
        return chunks, gen

    try:
        chunks, gen = asyncio.run(run())
    finally:
        asyncio.run(engine.close())
    assert len(chunks) >= 2  # tokens arrive as they are sampled, not all at the end
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == gen.finish_reason
    ids = [t for c in chunks for t in c.token_ids]
    lps = [x for c in chunks for x in c.logprobs]
    assert tuple(ids) == gen.token_ids
    assert tuple(lps) == gen.logprobs  # exactly
    assert gen.weights_versions == (0,) * len(gen.token_ids)
    assert all(c.prompt_tokens == len(PROMPT) for c in chunks)


def test_streamed_routing_adds_up_to_the_generation(tiny_pair):
    model, tok = tiny.tiny_model("qwen3_moe", experts=4, experts_per_token=2, tok=tiny_pair[1])
    engine = HfEngine.from_model(model, tok, HfEngineConfig(return_routed_experts=True))
    params = SamplingParams(temperature=1.0, max_tokens=5, seed=3)

    async def run():
        chunks = [c async for c in engine.stream(PROMPT, params)]
        return (
            chunks,
            await collect(engine.stream(PROMPT, params)),
            await engine.generate(PROMPT, params),
        )

    try:
        chunks, collected, gen = asyncio.run(run())
    finally:
        asyncio.run(engine.close())
    assert len(chunks[0].routed_experts) == len(PROMPT)  # the prompt's routing comes first
    assert all(len(c.routed_experts) == len(c.token_ids) for c in chunks[1:])
    assert gen.routed_experts == collected.routed_experts
    assert len(gen.routed_experts) == len(PROMPT) + len(gen.token_ids) - 1


def test_closing_a_stream_frees_its_slot_and_spares_the_others(tiny_engine):
    other = SamplingParams(temperature=1.0, max_tokens=20, seed=11)

    async def run():
        alone = await tiny_engine.generate(PROMPT[:20], other, session_id="alone")
        long = tiny_engine.stream(PROMPT, SamplingParams(temperature=0, max_tokens=2000))
        neighbour = asyncio.create_task(tiny_engine.generate(PROMPT[:20], other))
        got = 0
        async for chunk in long:
            got += len(chunk.token_ids)
            if got >= 3:
                break
        assert tiny_engine.stats()["load"] == 2  # both in the batch
        await long.aclose()  # type: ignore[attr-defined]
        await _until(lambda: tiny_engine.stats()["cancelled"] == 1)
        shared = await neighbour
        return alone, shared

    alone, shared = asyncio.run(run())
    stats = tiny_engine.stats()
    assert stats["load"] == 0 and stats["cancelled"] == 1
    assert stats["generated_tokens"] < 2000  # the long one stopped early
    assert shared.token_ids == alone.token_ids
    assert max(abs(a - b) for a, b in zip(shared.logprobs, alone.logprobs, strict=True)) <= 1e-4


def test_cancelling_the_consumer_task_frees_the_slot(tiny_engine):
    async def consume(seen: asyncio.Event):
        async with contextlib.aclosing(
            tiny_engine.stream(PROMPT, SamplingParams(temperature=0, max_tokens=2000))
        ) as chunks:
            async for _ in chunks:
                seen.set()

    async def run():
        seen = asyncio.Event()
        task = asyncio.create_task(consume(seen))
        await seen.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _until(lambda: tiny_engine.stats()["load"] == 0)

    asyncio.run(run())
    assert tiny_engine.stats()["cancelled"] == 1


def test_partial_update_continues_under_the_new_weights(tiny_pair, reference_logprobs):
    model, tok = copy.deepcopy(tiny_pair[0]), tiny_pair[1]
    engine = HfEngine.from_model(model, tok)
    before = copy.deepcopy(model)
    gen_rng = torch.Generator().manual_seed(5)
    new_state = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen_rng) for k, v in model.state_dict().items()
    }
    params = SamplingParams(temperature=1.0, max_tokens=30, seed=2)

    async def run():
        chunks = []
        update = None
        async for chunk in engine.stream(PROMPT, params, session_id="p"):
            chunks.append(chunk)
            if update is None and sum(len(c.token_ids) for c in chunks) >= 5:
                update = asyncio.create_task(engine.update_weights(new_state, mode="partial"))
        assert update is not None
        return chunks, await update

    try:
        chunks, version = asyncio.run(run())
    finally:
        asyncio.run(engine.close())
    assert version == 1
    ids = [t for c in chunks for t in c.token_ids]
    versions = [v for c in chunks for v in c.weights_versions]
    lps = [x for c in chunks for x in c.logprobs]
    assert len(ids) == 30 and chunks[-1].finish_reason == "length"  # it ran to its end
    split = versions.index(1)
    assert 5 <= split < 30 and versions == [0] * split + [1] * (30 - split)
    # each version's tokens are what that version's forward pass gives them
    old = reference_logprobs(before, PROMPT, ids, 1.0)
    new = reference_logprobs(model, PROMPT, ids, 1.0)
    assert max(abs(a - b) for a, b in zip(old[:split], lps[:split], strict=True)) <= 1e-4
    assert max(abs(a - b) for a, b in zip(new[split:], lps[split:], strict=True)) <= 1e-4
    # and the two versions really differ on those tokens (the check above could not pass by luck)
    assert max(abs(a - b) for a, b in zip(old[split:], lps[split:], strict=True)) > 1e-3
    assert engine.stats()["resumed"] == 1
