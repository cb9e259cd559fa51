"""LoRA in the torch trainer (``[optimizer] lora_rank``) and its adapter-only sync to the hf
engine: only the adapter trains, the base stays bit-for-bit, the engine scores exactly as
the trainer after a sync (fp32), the payload is the adapter's size, a checkpoint round-trips
and is served by the engine, and a target_modules name that matches nothing is one clear
error."""

from __future__ import annotations

import asyncio
import copy

import attrs
import pytest
import torch
from slr_engine_hf.engine import HfEngine
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.testing import trial

from slr.config import AlgorithmSection
from slr.contracts import SamplingParams
from slr.contracts.weights import WeightUpdate, is_lora, payload_bytes
from slr.engines.lora import is_adapter_folder
from slr.errors import ConfigError
from slr.run import checkpoints
from slr_testkit.tiny import chat_prompt, save, tiny_model

TEMPERATURE = 0.8
QUESTIONS = ["list the files", "print hello"]
LORA = TorchOptimizerConfig(lr=5e-2, lora_rank=4, lora_alpha=8, clip_grad=0.0)


async def _rollout(engine: HfEngine, tok, *, n: int, seed: int, tag: str):
    prompts = [chat_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    gens = await asyncio.gather(
        *(
            engine.generate(
                p, SamplingParams(temperature=TEMPERATURE, max_tokens=6, seed=seed * 100 + i)
            )
            for p in prompts
            for i in range(n)
        )
    )
    out = []
    for index, gen in enumerate(gens):
        k, i = divmod(index, n)
        prompt = prompts[k]
        seg = (
            prompt + list(gen.token_ids),
            [0] * len(prompt) + [1] * len(gen.token_ids),
            [0.0] * len(prompt) + list(gen.logprobs),
        )
        done = trial(f"{tag}{k}-{i}", f"{tag}{k}", [seg], float(i % 2))
        out.append(attrs.evolve(done, weights_version=gen.weights_version))
    return out


def _optimizer(model, options=LORA):
    return TorchOptimizer(
        options, algorithm=AlgorithmSection(), temperature=TEMPERATURE, model=model
    )


@pytest.mark.timeout(120)
def test_only_the_adapter_trains_and_the_engine_scores_as_the_trainer_after_a_sync():
    model, tok = tiny_model(seed=3)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    engine = HfEngine.from_model(copy.deepcopy(model), tok)
    opt = _optimizer(model)

    # the parameter set, and so AdamW's state, is the adapter alone
    trainable = {n for n, p in opt.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {id(p) for p in opt.params} == {id(p) for p in opt.model.parameters() if p.requires_grad}

    async def scenario():
        try:
            first = opt.step(await _rollout(engine, tok, n=4, seed=0, tag="a"))
            # not synced yet: the engine still serves the base (a same prompt, cached)
            stale = opt.step(await _rollout(engine, tok, n=4, seed=1, tag="b"))
            update = opt.export_weights()
            version = await engine.update_weights(update)
            synced = opt.step(await _rollout(engine, tok, n=4, seed=2, tag="c"))
            return first, stale, synced, update, version
        finally:
            await engine.close()

    first, stale, synced, update, version = asyncio.run(scenario())
    assert first["optimizer/updates"] == 1 and version == 1
    state = opt.optim.state_dict()["state"]
    assert len(state) == len(trainable)  # AdamW state for adapter parameters only

    # the base weights never moved, in the trainer or in the engine
    adapted = opt.model.state_dict()
    for name, value in base.items():
        head, _, leaf = name.rpartition(".")
        key = name if name in adapted else f"{head}.base_layer.{leaf}"  # an adapted layer
        assert torch.equal(adapted[key], value), name

    # the payload: only the adapter's matrices
    assert isinstance(update, WeightUpdate) and is_lora(update)
    assert update.lora is not None and update.lora.rank == 4
    assert set(update) == {n.replace(".default", "") for n in trainable}
    assert update.nbytes == sum(p.numel() * p.element_size() for p in opt.params)
    assert update.nbytes < payload_bytes(base) / 20

    # exact agreement (fp32) once synced; the adapter's move shows while it is not
    assert first["rollout/logprob_abs_diff_max"] < 1e-5
    assert stale["rollout/logprob_abs_diff_max"] > 1e-3
    assert synced["rollout/weights_version_min"] == 1
    assert synced["rollout/logprob_abs_diff_max"] < 1e-5


@pytest.mark.timeout(120)
def test_a_lora_checkpoint_round_trips_and_the_engine_serves_it(tmp_path):
    model, tok = tiny_model(seed=5)
    source = save(model, tok, tmp_path / "base")
    options = attrs.evolve(LORA, model=str(source))
    opt = _optimizer(None, options)

    async def rollout(folder, seed, tag):
        engine = HfEngine.from_folder(folder)
        try:
            return await _rollout(engine, tok, n=2, seed=seed, tag=tag)
        finally:
            await engine.close()

    opt.step(asyncio.run(rollout(source, 0, "a")))
    ckpt = tmp_path / "step-000001"
    opt.save(ckpt)
    (ckpt / checkpoints.COMPLETE).write_text("")  # what slr.run.checkpoints writes last
    policy = opt.servable_weights(ckpt)
    assert is_adapter_folder(policy)
    assert (policy / "tokenizer_config.json").is_file()
    assert (
        sum(f.stat().st_size for f in policy.glob("*.safetensors"))
        < sum(f.stat().st_size for f in source.glob("*.safetensors")) / 10
    )

    resumed = _optimizer(None, options)
    resumed.load(ckpt)
    assert resumed.steps == opt.steps == 1 and resumed.updates == opt.updates
    ours, theirs = opt.export_weights(), resumed.export_weights()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    a, b = opt.optim.state_dict()["state"], resumed.optim.state_dict()["state"]
    assert all(torch.equal(a[i]["exp_avg"], b[i]["exp_avg"]) for i in a)

    # the engine serves the adapter folder over its base: the trainer's own log-probs
    served = opt.step(asyncio.run(rollout(policy, 1, "b")))
    assert served["rollout/logprob_abs_diff_max"] < 1e-5

    # a full-weight optimizer refuses the adapter checkpoint, by name
    full = _optimizer(None, attrs.evolve(options, lora_rank=0))
    with pytest.raises(Exception, match="holds a LoRA adapter"):
        full.load(ckpt)


def test_target_modules_that_match_nothing_is_one_clear_error():
    model, _ = tiny_model(seed=0)
    options = attrs.evolve(LORA, target_modules=["qkv_proj"])
    with pytest.raises(ConfigError) as caught:
        _optimizer(model, options)
    message = str(caught.value)
    assert "\n" not in message
    assert "target_modules = ['qkv_proj'] matches no module" in message
    assert "q_proj" in message and "all-linear" in message
