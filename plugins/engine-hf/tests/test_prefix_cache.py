"""The shared-prefix KV cache: the radix tree alone, then the engine using it across sessions.

The engine tests use a tiny fp32 model (fast) and the engine's own counters: how many tokens
its prefills ran (``prefill_tokens``) says whether a prefix was computed again.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine
from slr_engine_hf.prefix_cache import RadixPrefixCache

from slr.contracts import ForcedDecoding, SamplingParams
from slr_testkit import tiny

# -- the tree on its own ---------------------------------------------------------------------


def _kv(ids, layers=2):
    """Fake KV whose every entry encodes (layer, token id), so slices can be checked."""
    t = torch.tensor(ids, dtype=torch.float32).view(1, 1, -1, 1)
    return [(t + 1000 * layer, -(t + 1000 * layer)) for layer in range(layers)]


def _ids_of(kv):
    return [int(x) for x in kv[0][0].view(-1)]


def test_tree_shares_a_prefix_and_splits_at_the_divergence():
    cache = RadixPrefixCache(max_tokens=1000)
    a = [1, 2, 3, 4, 5, 6]
    b = [1, 2, 3, 9, 9]
    cache.insert(a, _kv(a), routing=[[[t]] for t in a])
    cache.insert(b, _kv(b), routing=[[[t]] for t in b])
    assert cache.tokens == 6 + 2  # the shared [1, 2, 3] is held once
    kv, n, routing = cache.match([1, 2, 3, 9, 7, 7])
    assert n == 4 and _ids_of(kv) == [1, 2, 3, 9]
    assert routing == [[[1]], [[2]], [[3]], [[9]]]
    assert _ids_of([(kv[1][0] - 1000, None)]) == [1, 2, 3, 9]  # every layer sliced alike
    # mid-edge match, and the last prompt token is always left to run
    kv, n, _ = cache.match([1, 2, 3, 4, 5])
    assert n == 4 and _ids_of(kv) == [1, 2, 3, 4]
    assert cache.match([7, 1, 2]) == (None, 0, None)
    assert cache.hits == 2 and cache.reused_tokens == 8


def test_tree_stays_within_its_bound_evicting_least_recently_used():
    cache = RadixPrefixCache(max_tokens=10)
    shared = [1, 2, 3, 4]
    cache.insert([*shared, 10, 11], _kv([*shared, 10, 11]))
    cache.insert([*shared, 20, 21], _kv([*shared, 20, 21]))
    assert cache.tokens == 8
    cache.match([*shared, 10, 11, 0])  # the first branch is now the more recent one
    cache.insert([*shared, 30, 31, 32], _kv([*shared, 30, 31, 32]))
    assert cache.tokens <= 10
    assert cache.match([*shared, 10, 11, 0])[1] == 6  # kept
    assert cache.match([*shared, 20, 21, 0])[1] == 4  # evicted down to the shared prefix
    assert cache.match([*shared, 30, 31, 32, 0])[1] == 7  # just inserted
    assert cache.evicted_tokens == 2
    cache.clear()
    assert cache.tokens == 0 and cache.match([1, 2, 3])[1] == 0


def test_tree_copies_what_it_keeps():
    cache = RadixPrefixCache(max_tokens=100)
    kv = _kv([5, 6, 7])
    cache.insert([5, 6, 7], kv)
    kv[0][0].zero_()  # the caller reuses its tensors
    assert _ids_of(cache.match([5, 6, 7, 8])[0]) == [5, 6, 7]


def test_a_disabled_tree_holds_nothing():
    cache = RadixPrefixCache(max_tokens=0)
    cache.insert([1, 2, 3], _kv([1, 2, 3]))
    assert cache.tokens == 0 and cache.match([1, 2, 3, 4])[1] == 0


# -- the engine, across sessions --------------------------------------------------------------

SYSTEM = list(range(200, 320))  # a shared "system prompt and tools": 120 tokens


def _session(i: int, n: int = 9) -> list[int]:
    return [*SYSTEM, *range(400 + 20 * i, 400 + 20 * i + n)]


@pytest.fixture
def engine(tiny_pair):
    model, tok = tiny_pair
    engine = HfEngine.from_model(model, tok, HfEngineConfig(prefix_cache_tokens=4096))
    yield engine
    asyncio.run(engine.close())


def _check(model, prompt, gen, temperature, reference_logprobs):
    ref = reference_logprobs(model, prompt, gen.token_ids, temperature)
    worst = max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True))
    assert worst <= 1e-4, worst


def test_second_session_prefills_only_its_new_tokens(engine, tiny_pair, reference_logprobs):
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=1)
    first = asyncio.run(engine.generate(_session(0), params, session_id="a"))
    before = engine.stats()["prefill_tokens"]
    assert before == len(_session(0))
    second = asyncio.run(engine.generate(_session(1), params, session_id="b"))
    assert engine.stats()["prefill_tokens"] - before == len(_session(1)) - len(SYSTEM)
    for prompt, gen in ((_session(0), first), (_session(1), second)):
        _check(tiny_pair[0], prompt, gen, 1.0, reference_logprobs)


def test_sessions_starting_together_compute_the_shared_prefix_once(
    engine, tiny_pair, reference_logprobs
):
    params = [SamplingParams(temperature=0.7, max_tokens=4 + i, seed=i) for i in range(6)]
    prompts = [_session(i, n=5 + i) for i in range(6)]

    async def together():
        return await asyncio.gather(
            *(
                engine.generate(p, s, session_id=f"s{i}")
                for i, (p, s) in enumerate(zip(prompts, params, strict=True))
            )
        )

    gens = asyncio.run(together())
    unique = sum(len(p) - len(SYSTEM) for p in prompts)
    assert engine.stats()["prefill_tokens"] == len(SYSTEM) + unique
    for prompt, gen in zip(prompts, gens, strict=True):
        _check(tiny_pair[0], prompt, gen, 0.7, reference_logprobs)


def test_weight_update_invalidates_the_cache(tiny_pair, reference_logprobs):
    model, tok = tiny.tiny_model(seed=3, tok=tiny_pair[1])
    engine = HfEngine.from_model(model, tok)
    params = SamplingParams(temperature=1.0, max_tokens=5, seed=2)
    try:
        asyncio.run(engine.generate(_session(0), params))
        cached = engine.stats()["prefill_tokens"]
        new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
        asyncio.run(engine.update_weights(new_state))
        assert engine.stats()["prefix_cache_tokens"] == 0
        gen = asyncio.run(engine.generate(_session(1), params))
        # nothing of the old weights' KV is reused: the whole prompt runs again
        assert engine.stats()["prefill_tokens"] - cached == len(_session(1))
        _check(model, _session(1), gen, 1.0, reference_logprobs)
    finally:
        asyncio.run(engine.close())


def test_the_bound_holds_in_the_engine(tiny_pair):
    model, tok = tiny_pair
    engine = HfEngine.from_model(model, tok, HfEngineConfig(prefix_cache_tokens=150))
    params = SamplingParams(temperature=1.0, max_tokens=3, seed=0)
    try:
        for i in range(4):
            asyncio.run(engine.generate(_session(i), params))
            assert engine.stats()["prefix_cache_tokens"] <= 150
        assert engine.stats()["prefix_cache_evicted_tokens"] > 0
    finally:
        asyncio.run(engine.close())


# -- forced decoding ----------------------------------------------------------------------------


def test_forced_decoding_reproduces_what_the_engine_sampled(engine, tiny_pair, reference_logprobs):
    assert isinstance(engine, ForcedDecoding)
    params = SamplingParams(temperature=0.8, max_tokens=12, seed=5)
    gen = asyncio.run(engine.generate(_session(2), params))
    forced = asyncio.run(engine.force_decode(_session(3), gen.token_ids, params))
    again = asyncio.run(engine.force_decode(_session(2), gen.token_ids, params))
    assert again.token_ids == gen.token_ids
    assert max(abs(a - b) for a, b in zip(again.logprobs, gen.logprobs, strict=True)) <= 1e-4
    assert again.finish_reason == gen.finish_reason
    assert again.prompt_tokens == len(_session(2))
    _check(tiny_pair[0], _session(3), forced, 0.8, reference_logprobs)
    with pytest.raises(ValueError, match="at least one token"):
        asyncio.run(engine.force_decode(_session(2), [], params))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        asyncio.run(engine.force_decode(_session(2), [10**9], params))


def test_forced_decoding_records_routing_of_every_token_fed(tiny_pair, reference_logprobs):
    model, tok = tiny.tiny_model("qwen3_moe", experts=4, experts_per_token=2, tok=tiny_pair[1])
    engine = HfEngine.from_model(model, tok, HfEngineConfig(return_routed_experts=True))
    prompt, completion = _session(0), [11, 12, 13, 14]
    try:
        asyncio.run(engine.generate(_session(1), SamplingParams(max_tokens=2, seed=0)))
        gen = asyncio.run(engine.force_decode(prompt, completion, SamplingParams()))
    finally:
        asyncio.run(engine.close())
    assert engine.stats()["prefix_cache_reused_tokens"] == len(SYSTEM)  # routing from cache
    fed = [*prompt, *completion[:-1]]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([fed]), output_router_logits=True)
    expected = torch.stack([r.topk(2, dim=-1).indices for r in out.router_logits], dim=1)
    assert gen.routed_experts is not None
    assert torch.equal(torch.tensor(gen.routed_experts.tolist()), expected)
    _check(model, prompt, gen, 1.0, reference_logprobs)
