"""A replica's stream to the proxy in chunks: every token sampled since the consumer took
the previous chunk goes out as one Ray object (``slr.cluster.engines._Coalescer``), not one
object per token. No Ray needed: the coalescer sits between the engine's stream and the
actor's generator."""

from __future__ import annotations

import asyncio

import pytest

from slr.cluster.engines import _Coalescer, _Failure, merge_chunks
from slr.contracts import EngineUnavailable, GenerationChunk, collect

pytestmark = pytest.mark.timeout(30)


def _chunk(i: int, final: bool = False) -> GenerationChunk:
    return GenerationChunk(
        token_ids=[i],
        logprobs=[-0.5 * i],
        weights_versions=[1 if i < 3 else 2],
        routed_experts=[[[i, i + 1]]],
        finish_reason="length" if final else None,
        prompt_tokens=7 if i == 0 else 0,
    )


class _Engine:
    """Yields ``n`` tokens; ``produced`` is set after each one, so the test knows how many
    the engine has sampled while nobody reads (no sleeps)."""

    def __init__(self, n: int, fail_after: int | None = None) -> None:
        self.n, self.fail_after = n, fail_after
        self.produced = 0
        self.step = asyncio.Event()
        self.go_on = asyncio.Event()
        self.closed = False

    async def stream(self):
        try:
            for i in range(self.n):
                if self.fail_after is not None and i == self.fail_after:
                    raise EngineUnavailable("the device is gone")
                self.produced += 1
                self.step.set()
                yield _chunk(i, final=i == self.n - 1)
                if i == 0:
                    await self.go_on.wait()  # the test reads the first token alone
        finally:
            self.closed = True


async def _wait_for(engine: _Engine, produced: int) -> None:
    while engine.produced < produced:
        engine.step.clear()
        await engine.step.wait()


def test_tokens_sampled_while_nobody_reads_go_out_as_one_chunk():
    async def go():
        engine = _Engine(6)
        pending = _Coalescer(engine.stream())
        first = await pending.take()
        engine.go_on.set()
        await _wait_for(engine, 6)  # every token sampled, none taken yet
        rest = await pending.take()
        await pending.close()
        return first, rest, engine.closed

    first, rest, closed = asyncio.run(go())
    assert isinstance(first, GenerationChunk) and first.token_ids == (0,)
    assert isinstance(rest, GenerationChunk)
    assert rest.token_ids == (1, 2, 3, 4, 5) and rest.finish_reason == "length"
    assert rest.logprobs == (-0.5, -1.0, -1.5, -2.0, -2.5)
    assert rest.weights_versions == (1, 1, 2, 2, 2)
    assert rest.routed_experts is not None
    assert rest.routed_experts.tolist() == [[[i, i + 1]] for i in range(1, 6)]
    assert closed


def test_merged_chunks_add_up_to_the_same_generation():
    chunks = [_chunk(i, final=i == 4) for i in range(5)]

    async def stream(items):
        for c in items:
            yield c

    one_by_one = asyncio.run(collect(stream(chunks)))
    merged = asyncio.run(collect(stream([merge_chunks(chunks[:2]), merge_chunks(chunks[2:])])))
    assert merged == one_by_one
    assert merged.prompt_tokens == 7


def test_tokens_before_a_failure_arrive_then_the_failure():
    async def go():
        engine = _Engine(6, fail_after=3)
        pending = _Coalescer(engine.stream())
        first = await pending.take()
        engine.go_on.set()
        await _wait_for(engine, 3)  # tokens 1 and 2 sampled, then the failure
        return first, await pending.take(), await pending.take()

    first, before, failure = asyncio.run(go())
    assert isinstance(first, GenerationChunk) and first.token_ids == (0,)
    assert isinstance(before, GenerationChunk) and before.token_ids == (1, 2)
    assert isinstance(failure, _Failure)
    assert "the device is gone" in str(failure.error("r0"))


def test_closing_early_closes_the_engines_stream():
    async def go():
        engine = _Engine(6)
        pending = _Coalescer(engine.stream())
        await pending.take()
        await pending.close()  # the consumer went away after the first token
        return engine.closed

    assert asyncio.run(go())
