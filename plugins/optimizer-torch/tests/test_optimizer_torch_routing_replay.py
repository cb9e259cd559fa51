"""Routing replay (R3): the trainer routes policy tokens through the rollout's experts.

A tiny Qwen3-MoE model generates through the real hf engine with routing capture on; the
torch optimizer scores the trials (its pre-update agreement metrics) with replay off and on.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.replay import find_routers
from slr_optimizer_torch.testing import tiny_causal_lm

from slr.config import AlgorithmSection
from slr.contracts import Reward, SamplingParams, Segment, Trajectory, TrialResult
from slr.errors import ConfigError
from slr_testkit import tiny

pytestmark = pytest.mark.timeout(120)

PROMPT = [1, 9038, 2, 288, 1345, 314, 253, 1466, 30, 198, 50, 60, 70]


def _generate(model, tok, prompts, max_tokens=16):
    engine = HfEngine.from_model(model, tok, HfEngineConfig(return_routed_experts=True))

    async def run():
        return await asyncio.gather(
            *(
                engine.generate(p, SamplingParams(max_tokens=max_tokens, seed=i))
                for i, p in enumerate(prompts)
            )
        )

    try:
        return asyncio.run(run())
    finally:
        asyncio.run(engine.close())


def _trials(prompts, gens) -> list[TrialResult]:
    out = []
    for i, (prompt, gen) in enumerate(zip(prompts, gens, strict=True)):
        seg = Segment(
            token_ids=[*prompt, *gen.token_ids],
            loss_mask=[0] * len(prompt) + [1] * len(gen.token_ids),
            logprobs=[0.0] * len(prompt) + list(gen.logprobs),
            routed_experts=gen.routed_experts,
        )
        out.append(
            TrialResult(
                trial_id=f"t{i}",
                task_id="x",
                group_id="g",
                termination="completed",
                reward=Reward(value=float(i % 2)),
                trajectory=Trajectory(session_id=f"s{i}", segments=[seg], num_calls=1),
            )
        )
    return out


def _step(model, trials, *, replay: bool, pack: str = "none", **options) -> dict[str, float]:
    opt = TorchOptimizer(
        TorchOptimizerConfig(lr=1e-3, pack=pack, **options),
        algorithm=AlgorithmSection(routing_replay=replay),
        temperature=1.0,
        model=model,
    )
    return opt.step(trials)


@pytest.fixture(scope="module")
def moe():
    """A tiny top-2 MoE whose routers score experts 0, 1 and 2 within a hair of each other:
    which two of them a token gets is decided below bf16's resolution."""
    model, tok = tiny.tiny_model("qwen3_moe", experts=4, experts_per_token=2, seed=3)
    with torch.no_grad():
        for router in find_routers(model):
            w = router.weight
            w[0] = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(1)) * 0.5
            for e in (1, 2):
                noise = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(1 + e))
                w[e] = w[0] + 1e-4 * noise
    return model, tok


@pytest.fixture(scope="module")
def fp32_trials(moe):
    model, tok = moe
    prompts = [PROMPT, PROMPT]
    return _trials(prompts, _generate(copy.deepcopy(model), tok, prompts))


@pytest.mark.parametrize("pack", ["none", "tree"])
def test_replaying_captured_routing_reproduces_the_engine(moe, fp32_trials, pack):
    """fp32 engine and trainer: the replayed routing is the one the trainer computes, and
    the log-probs agree within 1e-4, with and without tree packing (two trials share the
    prompt, so the tree computes it once)."""
    m = _step(copy.deepcopy(moe[0]), fp32_trials, replay=True, pack=pack)
    assert m["rollout/logprob_abs_diff_max"] <= 1e-4
    assert m["routing_replay/changed_fraction"] == 0.0
    assert m["routing_replay/rows_unrecorded"] == 0.0
    assert m["pack/tree"] == float(pack == "tree")


def test_without_replay_a_bf16_rollout_and_fp32_trainer_diverge_in_routing(moe):
    """bf16 rollout, fp32 trainer: the two pick different experts for many tokens, and the
    trainer's log-probs of those tokens are far off; replaying the rollout's routing brings
    them back to bf16 rounding."""
    model, tok = moe
    prompts = [PROMPT, PROMPT[3:]]
    gens = _generate(copy.deepcopy(model).to(torch.bfloat16), tok, prompts, max_tokens=24)
    trials = _trials(prompts, gens)
    off = _step(copy.deepcopy(model), trials, replay=False)
    on = _step(copy.deepcopy(model), trials, replay=True)
    assert on["routing_replay/changed_fraction"] > 0.05  # bf16 routed many tokens otherwise
    assert on["rollout/logprob_abs_diff_max"] < off["rollout/logprob_abs_diff_max"] / 3
    assert on["rollout/logprob_pearson"] > off["rollout/logprob_pearson"]


def test_gradients_reach_the_router_under_replay(moe, fp32_trials):
    """The gate weights of the replayed experts come from the trainer's own router logits,
    so the routers still learn."""
    model = copy.deepcopy(moe[0])
    before = [r.weight.detach().clone() for r in find_routers(model)]
    # no weight decay: a router weight moves only if its gradient is non-zero
    _step(model, fp32_trials, replay=True, weight_decay=0.0)
    after = [r.weight.detach() for r in find_routers(model)]
    assert before and all(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_a_dense_model_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="routing_replay needs a MoE model; LlamaForCausalLM"):
        _step(tiny_causal_lm(), [], replay=True)


def test_gradient_checkpointing_is_refused_with_replay(moe):
    with pytest.raises(ConfigError, match="gradient_checkpointing cannot be combined"):
        _step(copy.deepcopy(moe[0]), [], replay=True, gradient_checkpointing=True)
