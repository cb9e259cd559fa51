"""Requests admitted together are prefilled together: fewer forward passes, the same tokens,
log-probs and routing as one at a time.

The scheduler is driven directly: requests are queued before its thread starts, so its
first step admits all of them at once (through the engine, when they arrive is up to the
event loop).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest
import torch
from slr_engine_hf.attention import use_decode_attention
from slr_engine_hf.engine import HfEngine
from slr_engine_hf.scheduler import Request, Scheduler

from slr.contracts import SamplingParams
from slr_testkit import tiny

pytestmark = pytest.mark.timeout(120)

SYSTEM = list(range(200, 260))  # a shared "system prompt": 60 tokens


def _scheduler(model, tok, *, routing_k: int = 0, prefix_cache_tokens: int = 4096):
    model.eval()
    use_decode_attention(model)
    return Scheduler(
        model=model,
        tokenizer=tok,
        max_batch=32,
        max_context=2048,
        eos_token_ids=set(),  # greedy runs to max_tokens: every row decodes as long
        prefix_cache_tokens=prefix_cache_tokens,
        routing_k=routing_k,
    )


def _admit_together(scheduler: Scheduler, prompts, max_tokens: int = 6):
    """Queue every prompt, then start the thread: its first step admits them all."""
    requests = [
        Request(
            prompt=list(p),
            sampling=SamplingParams(temperature=0, max_tokens=max_tokens),
            session_id=None,
            future=Future(),
        )
        for p in prompts
    ]
    for r in requests:
        scheduler.submit(r)
    scheduler.start()
    try:
        return [r.future.result(timeout=100) for r in requests]
    finally:
        scheduler.stop(RuntimeError("test over"))
        scheduler.join(10)


def _alone(model, tok, prompts, max_tokens: int = 6):
    """The same prompts one at a time, each on a fresh engine (no batch, no shared cache)."""
    out = []
    for p in prompts:
        engine = HfEngine.from_model(model, tok)
        try:
            out.append(
                asyncio.run(
                    engine.generate(list(p), SamplingParams(temperature=0, max_tokens=max_tokens))
                )
            )
        finally:
            asyncio.run(engine.close())
    return out


class _Passes:
    """Counts the decoder's forward passes (prefill passes and decode steps both run it)."""

    def __init__(self, model) -> None:
        self.calls = 0
        decoder = getattr(model, model.base_model_prefix)
        self._hook = decoder.register_forward_hook(self._count)

    def _count(self, *_) -> None:
        self.calls += 1

    def close(self) -> None:
        self._hook.remove()


def test_fresh_prompts_admitted_together_share_one_pass_and_match_one_at_a_time(
    tiny_pair, reference_logprobs
):
    model, tok = tiny_pair
    # eight prompts of different lengths (left padding), no shared prefix
    prompts = [list(range(1000 + 40 * i, 1000 + 40 * i + 20 + i)) for i in range(8)]
    scheduler = _scheduler(model, tok)
    passes = _Passes(model)
    try:
        gens = _admit_together(scheduler, prompts)
    finally:
        passes.close()
    # one at a time: 8 prefill passes; together: the few plan_passes groups them into
    assert passes.calls - scheduler.steps <= 2
    assert scheduler.prefill_passes == passes.calls - scheduler.steps
    assert scheduler.prefill_tokens == sum(len(p) for p in prompts)
    for prompt, gen, alone in zip(prompts, gens, _alone(model, tok, prompts), strict=True):
        assert gen.token_ids == alone.token_ids
        assert max(abs(a - b) for a, b in zip(gen.logprobs, alone.logprobs, strict=True)) <= 1e-4
        ref = reference_logprobs(model, prompt, gen.token_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True)) <= 1e-4


def test_cached_prefixes_and_fresh_prompts_admitted_together(tiny_pair, reference_logprobs):
    """Prompts that continue a cached prefix (by 1 to 30 tokens), fresh ones, one whose
    tokens but the last are all cached (no prefill at all) and a one-token prompt, in one
    admission: each reuses what the cache has and matches a forward pass."""
    model, tok = tiny_pair
    scheduler = _scheduler(model, tok)
    from slr_engine_hf.prefill import prefill

    _, kv, _ = prefill(model, SYSTEM, None, 0)
    scheduler.prefix_cache.insert(SYSTEM, kv)
    prompts = [
        [*SYSTEM, *range(500, 530)],
        [*SYSTEM, *range(600, 603)],
        [*SYSTEM, 700, 701, 702, 703, 704, 705, 706, 707, 708],
        [*SYSTEM, 800],  # everything but its last token cached
        list(range(900, 925)),
        list(range(950, 953)),
        [42],
    ]
    gens = _admit_together(scheduler, prompts)
    reused = [len(SYSTEM)] * 4 + [0] * 3
    assert scheduler.prefill_tokens == sum(len(p) - r for p, r in zip(prompts, reused, strict=True))
    assert scheduler.prefix_cache.reused_tokens == 4 * len(SYSTEM)
    for prompt, gen, alone in zip(prompts, gens, _alone(model, tok, prompts), strict=True):
        assert gen.token_ids == alone.token_ids
        ref = reference_logprobs(model, prompt, gen.token_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True)) <= 1e-4


def test_prompts_sharing_an_uncached_prefix_compute_it_once(tiny_pair, reference_logprobs):
    model, tok = tiny_pair
    scheduler = _scheduler(model, tok)
    prompts = [[*SYSTEM, *range(500 + 10 * i, 505 + 10 * i + i)] for i in range(6)]
    prompts.append(list(range(900, 960)))  # unrelated: goes in the first pass
    gens = _admit_together(scheduler, prompts)
    # one prompt runs the shared prefix; the rest wait one pass and run only their own tokens
    own = sum(len(p) - len(SYSTEM) for p in prompts[:6])
    assert scheduler.prefill_tokens == len(SYSTEM) + own + 60
    assert scheduler.prefix_cache.reused_tokens == 5 * len(SYSTEM)
    assert scheduler.prefill_passes == 2
    for prompt, gen in zip(prompts, gens, strict=True):
        ref = reference_logprobs(model, prompt, gen.token_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True)) <= 1e-4


def test_batched_prefill_records_the_routing_of_every_token_fed(tiny_pair):
    model, tok = tiny.tiny_model("qwen3_moe", experts=4, experts_per_token=2, tok=tiny_pair[1])
    scheduler = _scheduler(model, tok, routing_k=2)
    from slr_engine_hf.prefill import prefill

    _, kv, routing = prefill(model, SYSTEM, None, 0, routing_k=2)
    assert routing is not None
    scheduler.prefix_cache.insert(SYSTEM, kv, routing.tolist())
    prompts = [[*SYSTEM, *range(500, 520)], list(range(600, 611)), [*SYSTEM, 700, 701]]
    gens = _admit_together(scheduler, prompts)
    for prompt, gen in zip(prompts, gens, strict=True):
        fed = [*prompt, *gen.token_ids[:-1]]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([fed]), output_router_logits=True)
        expected = torch.stack([r.topk(2, dim=-1).indices for r in out.router_logits], dim=1)
        assert gen.routed_experts is not None
        assert torch.equal(torch.tensor(gen.routed_experts.tolist()), expected)


def test_plan_passes_keeps_short_rows_apart_from_a_long_one():
    from slr_engine_hf.prefill import PASS_TOKENS, plan_passes

    passes = plan_passes([3, 2000, 4, 5, 3])
    assert sorted(map(sorted, passes)) == [[0, 2, 3, 4], [1]]
    assert plan_passes([5] * 8) == [[0, 1, 2, 3, 4, 5, 6, 7]]
    # no pass over the bound unless it is one row
    sizes = [PASS_TOKENS // 4] * 6 + [PASS_TOKENS * 2]
    for group in plan_passes(sizes):
        assert len(group) == 1 or len(group) * max(sizes[i] for i in group) <= PASS_TOKENS
    assert plan_passes([]) == []


def test_defer_shared_holds_back_what_another_prompt_is_about_to_cache():
    from slr_engine_hf.prefill import PASS_COST, defer_shared

    same = list(range(100, 100 + PASS_COST))
    # the same prompt three times: two wait, then find it all cached (no pass at all)
    assert defer_shared([same, same, same], [0, 0, 0]) == [False, True, True]
    # a few shared tokens are not worth a pass; already cached ones save nothing
    small = PASS_COST // 2
    assert defer_shared([[*same[:small], 1, 2], [*same[:small], 3, 4]], [0, 0]) == [False, False]
    long = list(range(200, 200 + 2 * PASS_COST))
    assert defer_shared([[*long, 1], [*long, 2]], [0, 0]) == [False, True]
    assert defer_shared([[*long, 1], [*long, 2]], [len(long)] * 2) == [False, False]
