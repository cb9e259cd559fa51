"""Rollout / training alignment: the engine's log-probs are what a forward pass computes."""

from __future__ import annotations

import asyncio

import pytest

from slr.contracts import SamplingParams
from slr_testkit import tiny

QUESTIONS = [
    "Say hi.",
    "Write a bash command that counts the lines of every .py file in this folder.",
    "What is the capital of France? Answer in one word.",
    "Explain, in a few sentences, why the sky is blue during the day and red at sunset.",
    "ls",
    "Write a haiku about a tired compiler.",
]


def _prompts(tok):
    return [tiny.chat_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]


async def _generate_all(engine, prompts, params):
    return await asyncio.gather(
        *(
            engine.generate(p, s, session_id=f"lp-{i}")
            for i, (p, s) in enumerate(zip(prompts, params, strict=True))
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_smollm2_logprobs_match_a_forward_pass_under_concurrency(
    smollm2, reference_logprobs, temperature
):
    """Six concurrent requests of different prompt and completion lengths share batches
    (joining and leaving at different steps: where padding bugs hide)."""
    prompts = _prompts(smollm2.tokenizer)
    assert len({len(p) for p in prompts}) == len(prompts)  # all lengths differ
    params = [
        SamplingParams(temperature=temperature, max_tokens=m, seed=100 + i)
        for i, m in enumerate([12, 40, 6, 32, 20, 28])
    ]
    gens = asyncio.run(_generate_all(smollm2, prompts, params))
    assert sum(len(g.token_ids) for g in gens) > 60
    for prompt, gen in zip(prompts, gens, strict=True):
        ref = reference_logprobs(smollm2.model, prompt, gen.token_ids, temperature)
        worst = max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True))
        assert worst <= 1e-4, (temperature, len(prompt), worst)
        assert gen.prompt_tokens == len(prompt)


@pytest.mark.slow
def test_greedy_logprobs_are_untempered_and_truncation_does_not_change_them(
    smollm2, reference_logprobs
):
    prompt = _prompts(smollm2.tokenizer)[2]
    greedy = asyncio.run(smollm2.generate(prompt, SamplingParams(temperature=0, max_tokens=8)))
    ref = reference_logprobs(smollm2.model, prompt, greedy.token_ids, 0.0)
    assert max(abs(a - b) for a, b in zip(ref, greedy.logprobs, strict=True)) <= 1e-4
    # top-k / top-p restrict what may be sampled, not the reported distribution
    truncated = asyncio.run(
        smollm2.generate(
            prompt, SamplingParams(temperature=0.7, top_k=5, top_p=0.8, max_tokens=8, seed=3)
        )
    )
    ref = reference_logprobs(smollm2.model, prompt, truncated.token_ids, 0.7)
    assert max(abs(a - b) for a, b in zip(ref, truncated.logprobs, strict=True)) <= 1e-4


@pytest.mark.slow
def test_session_prefix_reuse_keeps_logprobs_exact(smollm2, reference_logprobs):
    """The second call of a session reuses the cached prefix and still matches."""
    tok = smollm2.tokenizer
    messages = [{"role": "user", "content": "Name a colour."}]
    prompt = tiny.chat_prompt(tok, messages)
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=7)
    first = asyncio.run(smollm2.generate(prompt, params, session_id="prefix-1"))
    before = smollm2.stats()["prefix_cache_reused_tokens"]
    follow = tok.encode(
        "<|im_end|>\n<|im_start|>user\nAnother one.<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt2 = [*prompt, *first.token_ids, *follow]
    second = asyncio.run(smollm2.generate(prompt2, params, session_id="prefix-1"))
    reused = smollm2.stats()["prefix_cache_reused_tokens"] - before
    assert reused >= len(prompt) + len(first.token_ids) - 1
    ref = reference_logprobs(smollm2.model, prompt2, second.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref, second.logprobs, strict=True)) <= 1e-4


def test_tiny_model_batched_logprobs_match(tiny_engine, tiny_pair, reference_logprobs):
    """The same property on a tiny model with 12 rows joining and leaving (fast)."""
    model, _ = tiny_pair
    prompts = [list(range(50, 50 + 3 * (i + 1))) for i in range(12)]
    params = [SamplingParams(temperature=1.0, max_tokens=4 + 3 * i, seed=i) for i in range(12)]
    gens = asyncio.run(_generate_all(tiny_engine, prompts, params))
    for prompt, gen in zip(prompts, gens, strict=True):
        ref = reference_logprobs(model, prompt, gen.token_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True)) <= 1e-4


@pytest.mark.parametrize("temperature", [4.5e-45, 1e-30, 9e-6])
def test_a_vanishing_temperature_is_greedy_not_nan(temperature):
    """Dividing the logits by a denormal temperature overflows to inf, and sampling from
    that raised "probability tensor contains inf / nan" (a 500 from the proxy, found by its
    schema fuzz). Below ``GREEDY_BELOW`` a temperature is greedy, as in vLLM."""
    import math

    import torch
    from slr_engine_hf.sampling import new_generator, sample_rows

    params = SamplingParams(temperature=temperature)
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0)) * 5
    tokens, values = sample_rows(logits, [params], [new_generator(1)])
    assert tokens == [int(torch.argmax(logits[0]))]
    assert math.isfinite(values[0])
    assert params.temperature == 0.0  # recorded as greedy: the trainer scores it untempered
    assert SamplingParams(temperature=1e-3).temperature == 1e-3  # small but real: kept
