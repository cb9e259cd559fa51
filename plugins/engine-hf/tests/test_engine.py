"""HfEngine behaviour: sampling controls, finish reasons, errors, weight swaps, the loop."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine

from slr.contracts import ContextOverflow, EngineUnavailable, SamplingParams
from slr.plugins import PluginManager
from slr_testkit import tiny

PROMPT = list(range(100, 130))


def test_registered_as_the_hf_engine_plugin():
    registration = PluginManager().get("engine", "hf")
    assert registration.plugin.distribution == "slr-engine-hf"
    assert registration.config_cls is HfEngineConfig
    assert registration.load() is HfEngine


def test_config_section_is_validated_by_name():
    from slr.config.structure import structure
    from slr.errors import ConfigError

    options = structure({"max_batch": 4, "dtype": "bfloat16"}, HfEngineConfig, path="engine")
    assert (options.max_batch, options.dtype, options.model) == (
        4,
        "bfloat16",
        "smollm2-135m-instruct",
    )
    with pytest.raises(ConfigError, match="max_bach"):
        structure({"max_bach": 4}, HfEngineConfig, path="engine")
    with pytest.raises(ConfigError, match="float64"):
        structure({"dtype": "float64"}, HfEngineConfig, path="engine")


def test_seeded_sampling_reproducible_and_seeds_differ(tiny_engine):
    async def run():
        p = SamplingParams(temperature=1.0, max_tokens=20, seed=42)
        # concurrently, so the two share batches with a third, different request
        return await asyncio.gather(
            tiny_engine.generate(PROMPT, p),
            tiny_engine.generate(PROMPT, p),
            tiny_engine.generate(PROMPT, SamplingParams(temperature=1.0, max_tokens=20, seed=43)),
        )

    a, b, c = asyncio.run(run())
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_max_tokens_ends_with_length(tiny_engine):
    gen = asyncio.run(tiny_engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=7)))
    assert len(gen.token_ids) == 7
    assert gen.finish_reason == "length"


def test_stop_string_and_stop_token_end_with_stop(tiny_pair):
    model, tok = copy.deepcopy(tiny_pair[0]), tiny_pair[1]
    prompt = tiny.chat_prompt(tok, [{"role": "user", "content": "say the words"}])
    tiny.teach(model, tok, [(prompt, "alpha beta gamma delta epsilon zeta")], end_with_eos=False)
    engine = HfEngine.from_model(model, tok)
    try:
        full = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0, max_tokens=12)))
        text = tok.decode(full.token_ids)
        assert text.startswith("alpha beta gamma delta"), text
        by_text = asyncio.run(
            engine.generate(prompt, SamplingParams(temperature=0, max_tokens=12, stop=["gamma"]))
        )
        assert by_text.finish_reason == "stop"
        assert tok.decode(by_text.token_ids).endswith("gamma")
        assert len(by_text.token_ids) < len(full.token_ids)
        stop_id = full.token_ids[1]
        by_id = asyncio.run(
            engine.generate(
                prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_id])
            )
        )
        assert by_id.finish_reason == "stop"
        assert by_id.token_ids == full.token_ids[:2]
    finally:
        asyncio.run(engine.close())


def test_eos_ends_with_stop(tiny_pair):
    model, tok = copy.deepcopy(tiny_pair[0]), tiny_pair[1]
    prompt = tiny.chat_prompt(tok, [{"role": "user", "content": "list files"}])
    tiny.teach(model, tok, [(prompt, "```bash\nls\n```")])
    engine = HfEngine.from_model(model, tok)
    try:
        gen = asyncio.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=30)))
    finally:
        asyncio.run(engine.close())
    assert gen.finish_reason == "stop"
    assert gen.token_ids[-1] == tok.eos_token_id
    assert tok.decode(gen.token_ids[:-1]) == "```bash\nls\n```"


def test_prompt_longer_than_context_is_a_clear_error(tiny_pair):
    model, tok = tiny_pair
    engine = HfEngine.from_model(model, tok, HfEngineConfig(max_context=64))
    try:
        with pytest.raises(
            ContextOverflow, match="prompt is 64 tokens but the model's context is 64"
        ):
            asyncio.run(engine.generate(list(range(64)), SamplingParams()))
        # a prompt that fits stops at the context limit with "length"
        gen = asyncio.run(engine.generate(list(range(60)), SamplingParams(max_tokens=50)))
        assert len(gen.token_ids) == 4 and gen.finish_reason == "length"
        with pytest.raises(ValueError, match="outside the vocabulary"):
            asyncio.run(engine.generate([len(tok) + 5], SamplingParams()))
        assert asyncio.run(engine.health()) is True  # bad requests do not hurt the engine
    finally:
        asyncio.run(engine.close())


def test_update_weights_waits_for_running_generations(tiny_pair, reference_logprobs):
    model, tok = copy.deepcopy(tiny_pair[0]), tiny_pair[1]
    engine = HfEngine.from_model(model, tok)
    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    before = copy.deepcopy(model)
    params = SamplingParams(temperature=1.0, max_tokens=40, seed=1)

    async def run():
        first = asyncio.create_task(engine.generate(PROMPT, params, session_id="w"))
        while engine.stats()["generated_tokens"] < 2:  # it is running before the update
            await asyncio.sleep(0.001)
        update = asyncio.create_task(engine.update_weights(new_state))
        second = asyncio.create_task(engine.generate(PROMPT, params, session_id="w"))
        return await first, await update, await second

    try:
        first, version, second = asyncio.run(run())
    finally:
        asyncio.run(engine.close())
    assert version == 1 and engine.weights_version == 1
    assert first.weights_version == 0 and second.weights_version == 1
    # each generation ran wholly under its own version's weights
    ref_old = reference_logprobs(before, PROMPT, first.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref_old, first.logprobs, strict=True)) <= 1e-4
    ref_new = reference_logprobs(model, PROMPT, second.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref_new, second.logprobs, strict=True)) <= 1e-4


def test_update_weights_rejects_unknown_names(tiny_engine):
    with pytest.raises(KeyError, match="names the model does not have"):
        asyncio.run(tiny_engine.update_weights({"no.such.weight": torch.zeros(1)}))
    assert tiny_engine.weights_version == 0


def test_event_loop_stays_responsive_while_generating(tiny_engine):
    """Forward passes run on the engine's thread: other coroutines keep running."""

    async def run():
        gen = asyncio.create_task(
            tiny_engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=300))
        )
        ticks = 0
        while not gen.done():
            await asyncio.sleep(0)
            ticks += 1
            if ticks == 1000:
                break
        done_early = gen.done()
        await gen
        return ticks, done_early

    ticks, done_early = asyncio.run(run())
    assert ticks == 1000 and not done_early


def test_cancelled_request_leaves_the_batch(tiny_engine):
    async def run():
        task = asyncio.create_task(
            tiny_engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2000))
        )
        while tiny_engine.stats()["generated_tokens"] < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the engine still serves, and the cancelled row is gone once this finishes
        gen = await tiny_engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3))
        return gen

    gen = asyncio.run(run())
    assert len(gen.token_ids) == 3
    assert tiny_engine.stats()["load"] == 0


def test_close_fails_calls_in_flight_instead_of_hanging(tiny_pair):
    model, tok = tiny_pair
    engine = HfEngine.from_model(model, tok)

    async def run():
        task = asyncio.create_task(
            engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5000))
        )
        while engine.stats()["generated_tokens"] < 2:
            await asyncio.sleep(0.001)
        await engine.close()
        with pytest.raises(EngineUnavailable):
            await asyncio.wait_for(task, 30)
        assert await engine.health() is False
        with pytest.raises(EngineUnavailable):
            await engine.generate(PROMPT, SamplingParams(max_tokens=1))

    asyncio.run(run())


def test_moe_tiny_models_generate(tiny_pair):
    for arch in ("qwen3_moe", "mixtral"):
        model, tok = tiny.tiny_model(arch, tok=tiny_pair[1])
        engine = HfEngine.from_model(model, tok)
        try:
            gen = asyncio.run(engine.generate(PROMPT, SamplingParams(max_tokens=4, seed=0)))
        finally:
            asyncio.run(engine.close())
        assert len(gen.token_ids) == 4


def test_loads_a_saved_model_folder(tiny_pair, tmp_path):
    model, tok = tiny_pair
    folder = tiny.save(model, tok, tmp_path / "tiny")
    engine = HfEngine(HfEngineConfig(model=str(folder)))
    try:
        a = asyncio.run(engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5)))
    finally:
        asyncio.run(engine.close())
    direct = HfEngine.from_model(model, tok)
    try:
        b = asyncio.run(direct.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5)))
    finally:
        asyncio.run(direct.close())
    assert a.token_ids == b.token_ids


@pytest.mark.parametrize("architecture", ["qwen3_moe", "mixtral"])
def test_moe_routing_is_recorded_for_every_token_fed(tiny_pair, reference_logprobs, architecture):
    """With return_routed_experts, each token run through the model (prompt and all
    generated tokens but the last) carries its top-k experts per MoE layer, matching a
    separate forward pass; a session's second call includes the reused prefix too."""
    model, tok = tiny.tiny_model(architecture, experts=4, experts_per_token=2, tok=tiny_pair[1])
    engine = HfEngine.from_model(model, tok, HfEngineConfig(return_routed_experts=True))
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=0)

    async def run():
        first, other = await asyncio.gather(
            engine.generate(PROMPT, params, session_id="m"),
            engine.generate(PROMPT[:21], params, session_id="n"),
        )
        follow = [*PROMPT, *first.token_ids, 77, 78]
        second = await engine.generate(follow, params, session_id="m")
        return first, other, follow, second

    try:
        first, other, follow, second = asyncio.run(run())
    finally:
        asyncio.run(engine.close())
    # the shared-prefix cache: "n" and "m" share PROMPT[:20] (whichever ran first), and the
    # second call of "m" reuses its first call
    assert engine.stats()["prefix_cache_hits"] == 2
    for prompt, gen in ((PROMPT, first), (PROMPT[:21], other), (follow, second)):
        fed = [*prompt, *gen.token_ids[:-1]]
        assert len(gen.routed_experts) == len(fed)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([fed]), output_router_logits=True)
        expected = torch.stack([r.topk(2, dim=-1).indices for r in out.router_logits], dim=1)
        assert gen.routed_experts is not None
        assert torch.equal(torch.tensor(gen.routed_experts.tolist()), expected)
        ref = reference_logprobs(model, prompt, gen.token_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True)) <= 1e-4


def test_routing_capture_needs_a_moe_model(tiny_pair):
    with pytest.raises(ValueError, match="not a mixture-of-experts model"):
        HfEngine.from_model(*tiny_pair, HfEngineConfig(return_routed_experts=True))
