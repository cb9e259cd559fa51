"""Helpers for tests and benchmarks: tiny random models and trials sampled from a real model.

``sample_trials`` is a minimal reference sampler: plain ancestral sampling with a full
forward per token, recording the behaviour log-prob under the shared definition
(``log_softmax(logits / temperature)``, full vocabulary). It stands in for an engine only
where a test needs trajectories from known weights; engines are tested on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from slr.contracts import Reward, Segment, Trajectory, TrialResult


def tiny_causal_lm(
    *,
    vocab_size: int = 64,
    hidden_size: int = 32,
    layers: int = 2,
    seed: int = 0,
    init_std: float = 0.02,
) -> nn.Module:
    """A randomly initialised Llama-architecture model small enough to train in seconds.

    A larger ``init_std`` gives peakier next-token distributions, more like a trained model's.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=init_std,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


@torch.no_grad()
def sample(
    model: nn.Module,
    prompt: Sequence[int],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` completions of ``prompt``: token ids ``(n, max_new)`` and their behaviour log-probs."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)] * n, dtype=torch.long, device=device)
    tokens, logprobs = [], []
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids).logits[:, -1].float() / temperature
        lp = torch.log_softmax(logits, dim=-1)
        nxt = torch.multinomial(lp.exp().cpu(), 1, generator=generator).to(device)
        tokens.append(nxt.squeeze(-1))
        logprobs.append(lp.gather(-1, nxt).squeeze(-1))
        ids = torch.cat([ids, nxt], dim=-1)
    return torch.stack(tokens, dim=1).cpu(), torch.stack(logprobs, dim=1).cpu()


def trial(
    trial_id: str,
    group_id: str,
    segments: Sequence[tuple[Sequence[int], Sequence[int], Sequence[float]]],
    reward: float | None,
    *,
    termination: str = "completed",
) -> TrialResult:
    """A TrialResult from ``(token_ids, loss_mask, logprobs)`` segments."""
    return TrialResult(
        trial_id=trial_id,
        task_id=group_id,
        group_id=group_id,
        termination=termination,
        reward=None if reward is None else Reward(value=reward),
        trajectory=Trajectory(
            session_id=trial_id,
            segments=[Segment(token_ids=t, loss_mask=m, logprobs=lp) for t, m, lp in segments],
        ),
    )


def sample_trials(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    reward: Callable[[list[int]], float],
    generator: torch.Generator,
    prefix: str = "t",
) -> list[TrialResult]:
    """One group of ``n`` single-segment trials per prompt, rewarded by ``reward(completion)``."""
    out = []
    for p_index, prompt in enumerate(prompts):
        tokens, logprobs = sample(
            model,
            prompt,
            n=n,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=generator,
        )
        for i in range(n):
            completion = tokens[i].tolist()
            seg = (
                list(prompt) + completion,
                [0] * len(prompt) + [1] * len(completion),
                [0.0] * len(prompt) + logprobs[i].tolist(),
            )
            out.append(
                trial(f"{prefix}{p_index}-{i}", f"{prefix}g{p_index}", [seg], reward(completion))
            )
    return out
