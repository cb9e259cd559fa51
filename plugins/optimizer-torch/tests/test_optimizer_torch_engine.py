"""The trainer against the real embedded engine: same log-prob definition, weight sync.

The engine samples with its KV cache, batching and per-request sampling; the trainer scores
the same tokens with a plain forward. They must agree on every policy token, and after a
step the exported weights must bring the engine back into agreement (a missed sync must
show in the metric).
"""

from __future__ import annotations

import asyncio
import copy

import attrs
import pytest
from slr_engine_hf.engine import HfEngine
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.testing import trial

from slr.config import AlgorithmSection
from slr.contracts import SamplingParams
from slr_testkit.tiny import chat_prompt, tiny_model

TEMPERATURE = 0.8
QUESTIONS = ["list the files", "print hello", "make a folder"]


async def _rollout(engine: HfEngine, tok, *, n: int, seed: int, tag: str):
    prompts = [chat_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    calls = [
        engine.generate(
            prompt,
            SamplingParams(temperature=TEMPERATURE, max_tokens=8, seed=seed * 100 + k * 10 + i),
            session_id=f"{tag}{k}-{i}",
        )
        for k, prompt in enumerate(prompts)
        for i in range(n)
    ]
    generations = await asyncio.gather(*calls)
    trials, versions = [], set()
    for index, gen in enumerate(generations):
        k, i = divmod(index, n)
        prompt = prompts[k]
        seg = (
            prompt + list(gen.token_ids),
            [0] * len(prompt) + [1] * len(gen.token_ids),
            [0.0] * len(prompt) + list(gen.logprobs),
        )
        # alternating rewards, so every group carries signal and the weights move
        done = trial(f"{tag}{k}-{i}", f"{tag}{k}", [seg], float(i % 2))
        trials.append(attrs.evolve(done, weights_version=gen.weights_version))
        versions.add(gen.weights_version)
    return trials, versions


@pytest.mark.slow
def test_engine_logprobs_match_the_trainer_and_weight_sync_restores_agreement():
    model, tok = tiny_model(seed=2)
    engine = HfEngine.from_model(model, tok)
    opt = TorchOptimizer(
        TorchOptimizerConfig(lr=1e-2),
        algorithm=AlgorithmSection(),
        temperature=TEMPERATURE,
        model=copy.deepcopy(model),
    )

    async def scenario():
        try:
            trials, versions = await _rollout(engine, tok, n=4, seed=0, tag="a")
            first = opt.step(trials)
            assert versions == {0}

            # no sync: the engine still serves the old weights
            stale_trials, _ = await _rollout(engine, tok, n=4, seed=1, tag="b")
            stale = opt.step(stale_trials)

            version = await engine.update_weights(opt.export_weights())
            synced_trials, versions = await _rollout(engine, tok, n=4, seed=2, tag="c")
            synced = opt.step(synced_trials)
            return first, stale, synced, version, versions
        finally:
            await engine.close()

    first, stale, synced, version, versions = asyncio.run(scenario())
    assert first["rollout/logprob_pearson"] > 0.999
    assert first["rollout/logprob_abs_diff_mean"] < 1e-4
    assert stale["rollout/logprob_abs_diff_mean"] > 100 * first["rollout/logprob_abs_diff_mean"]
    assert version == 1 and versions == {1}
    assert first["rollout/weights_version_max"] == 0
    assert synced["rollout/weights_version_min"] == synced["rollout/weights_version_max"] == 1
    assert synced["rollout/logprob_pearson"] > 0.999
    assert synced["rollout/logprob_abs_diff_mean"] < 1e-4


@pytest.mark.slow
def test_the_default_config_trains_the_model_the_engine_serves():
    """No [optimizer] model: the engine's packaged SmolLM2 folder, resolved the same way."""
    from slr_engine_hf.config import HfEngineConfig
    from slr_engine_hf.models import resolve

    from slr.config import Config, PluginChoice
    from slr.plugins import PluginManager

    # the defaults of the two plugins, as load_config resolves an empty config
    cfg = Config(
        engine=PluginChoice(name="hf", options=HfEngineConfig()),
        optimizer=PluginChoice(name="torch", options=TorchOptimizerConfig()),
        **{s: PluginChoice(name="unused") for s in ("agent", "backend", "verifier")},
    )
    opt = PluginManager().get("optimizer", "torch").create(cfg.optimizer.options, config=cfg)
    folder = resolve(cfg.engine.options.model)
    assert opt.options.model == cfg.engine.options.model
    assert opt.model.config.name_or_path == str(folder)
    assert sum(p.numel() for p in opt.model.parameters()) > 100_000_000


def test_a_checkpoint_is_a_model_folder_the_engine_serves(tmp_path):
    """policy/ carries the tokenizer and chat template, so evaluation can load a checkpoint."""
    from slr_testkit.tiny import save

    model, tok = tiny_model(seed=4)
    source = save(model, tok, tmp_path / "source")
    opt = TorchOptimizer(
        TorchOptimizerConfig(model=str(source), lr=1e-2),
        algorithm=AlgorithmSection(),
        temperature=TEMPERATURE,
    )

    async def scenario():
        engine = HfEngine.from_folder(source)
        try:
            trials, _ = await _rollout(engine, tok, n=2, seed=0, tag="a")
        finally:
            await engine.close()
        opt.step(trials)
        opt.save(tmp_path / "step-000001")
        served = HfEngine.from_folder(opt.servable_weights(tmp_path / "step-000001"))
        try:
            trials, _ = await _rollout(served, tok, n=2, seed=1, tag="b")
        finally:
            await served.close()
        return trials

    trials = asyncio.run(scenario())
    assert (tmp_path / "step-000001" / "policy" / "tokenizer.json").is_file()
    # the engine serves exactly the trained weights: the trainer agrees with its log-probs
    metrics = opt.step(trials)
    assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4
