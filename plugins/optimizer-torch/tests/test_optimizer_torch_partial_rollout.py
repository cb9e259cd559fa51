"""Partial rollout, end to end: a generation spans a real optimizer step, and the trainer
scores each version's tokens exactly as that version sampled them.

The torch optimizer takes a step (v0 -> v1) while the real hf engine (fp32) still serves
v0; a generation starts, and while it streams the engine gets the step's weights with
``mode="partial"`` (the step itself runs first, so its duration cannot race the stream). The
generation continues; its tokens carry versions 0 then 1; the trainer's recomputed
log-probs under v0 (the optimizer before its step) and under v1 (after) match the behaviour
log-probs of that version's tokens within 1e-4, and the batch's version metrics see both.
"""

from __future__ import annotations

import asyncio
import copy

import attrs
import pytest
import torch
from slr_engine_hf.engine import HfEngine
from slr_optimizer_torch import batch as batching
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.model import Scorer
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.testing import sample_trials, trial

from slr.config import AlgorithmSection
from slr.contracts import SamplingParams
from slr_testkit.tiny import chat_prompt, tiny_model

TEMPERATURE = 0.9
MAX_TOKENS = 30
SWITCH_AFTER = 6  # tokens streamed before the trainer's new weights are published


@pytest.mark.timeout(120)
def test_an_interrupted_generation_is_scored_per_version_by_the_trainer():
    model, tok = tiny_model(seed=4)
    engine = HfEngine.from_model(model, tok)
    opt = TorchOptimizer(
        TorchOptimizerConfig(lr=1e-2),
        algorithm=AlgorithmSection(),
        temperature=TEMPERATURE,
        model=copy.deepcopy(model),
    )
    v0 = copy.deepcopy(opt.model)  # the trainer's weights before its step
    prompts = [chat_prompt(tok, [{"role": "user", "content": q}]) for q in ("ls", "pwd")]
    # a batch with signal, so the step really moves the weights
    training = sample_trials(
        v0,
        prompts,
        n=4,
        max_new_tokens=3,
        temperature=TEMPERATURE,
        reward=lambda c: float(c[0] % 2 == 0),
        generator=torch.Generator().manual_seed(0),
    )
    prompt = chat_prompt(tok, [{"role": "user", "content": "make a folder"}])
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=3)
    step_metrics = opt.step(training)
    assert step_metrics["update/count"] == 1
    v1_state = opt.export_weights()

    async def scenario():
        chunks, update = [], None
        async for chunk in engine.stream(prompt, params, session_id="partial"):
            chunks.append(chunk)
            if update is None and sum(len(c.token_ids) for c in chunks) >= SWITCH_AFTER:
                update = asyncio.create_task(engine.update_weights(v1_state, mode="partial"))
        assert update is not None
        return chunks, await update

    try:
        chunks, version = asyncio.run(scenario())
    finally:
        asyncio.run(engine.close())
    assert version == 1
    ids = [t for c in chunks for t in c.token_ids]
    lps = [x for c in chunks for x in c.logprobs]
    versions = [v for c in chunks for v in c.weights_versions]
    assert len(ids) == MAX_TOKENS  # it continued to its end
    split = versions.index(1)
    assert SWITCH_AFTER <= split < MAX_TOKENS
    assert versions == [0] * split + [1] * (MAX_TOKENS - split)

    interrupted = trial(
        "p",
        "p",
        [(prompt + ids, [0] * len(prompt) + [1] * len(ids), [0.0] * len(prompt) + lps)],
        1.0,
    )
    trajectory = interrupted.trajectory
    assert trajectory is not None
    segment = trajectory.segments[0]
    segment = attrs.evolve(segment, weights_versions=[0] * len(prompt) + versions)
    interrupted = attrs.evolve(interrupted, trajectory=attrs.evolve(trajectory, segments=[segment]))

    # the trainer's own scoring of the batch, under each version's weights
    tb = batching.assemble([interrupted])
    token_versions = tb.weights_versions[tb.response_mask > 0]
    behaviour = tb.rollout_logprobs[tb.response_mask > 0]
    scored = {}
    for v, weights in ((0, v0), (1, opt.model)):
        with torch.no_grad():
            s = Scorer(weights, temperature=TEMPERATURE)(
                tb.input_ids, tb.attention_mask, tb.response_mask, entropy=False
            )
        scored[v] = s.logprobs.float()[tb.response_mask > 0]
    for v in (0, 1):
        mine = token_versions == v
        assert int(mine.sum()) == (split if v == 0 else MAX_TOKENS - split)
        assert float((scored[v][mine] - behaviour[mine]).abs().max()) <= 1e-4, v
    # the versions really differ on these tokens, so the match above says something
    assert (
        float((scored[0][token_versions == 1] - behaviour[token_versions == 1]).abs().max()) > 1e-3
    )

    # and the next step sees the spread: the weights being updated are v1
    metrics = opt.step([interrupted])
    assert (metrics["rollout/token_version_min"], metrics["rollout/token_version_max"]) == (0, 1)
    assert metrics["rollout/trials_multi_version"] == 1
    assert metrics["rollout/token_age_max"] == 1
    assert metrics["rollout/stale_token_fraction"] == pytest.approx(split / MAX_TOKENS)
