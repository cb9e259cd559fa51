"""Turning one step's logits into tokens and behaviour log-probs, row by row.

The log-prob of a sampled token is taken under ``log_softmax(logits / temperature)`` over
the full vocabulary, before top-k / top-p truncation; at temperature 0 (greedy) under the
untempered ``log_softmax(logits)``. The trainer recomputes exactly this from a forward
pass, so rollout and training agree on what the policy's probability of a token was.
"""

from __future__ import annotations

import secrets

import torch

from slr.contracts import SamplingParams


def new_generator(seed: int | None) -> torch.Generator:
    """A CPU generator for one request: seeded for reproducibility, else fresh entropy."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed if seed is not None else secrets.randbits(63))
    return gen


def token_logprobs(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary log-probs per row: ``log_softmax(logits / t)`` (t = 0 reads as 1)."""
    t = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    return torch.log_softmax(logits.float() / t.unsqueeze(-1), dim=-1)


def truncate(logprobs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """One row's log-probs with everything outside top-k / the top-p nucleus set to -inf."""
    out = logprobs
    if top_k and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lp, order = torch.sort(out, descending=True)
        probs = sorted_lp.exp()
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        before = torch.cumsum(probs, dim=-1) - probs
        drop = before >= top_p
        drop[0] = False
        out = out.clone()
        out[order[drop]] = float("-inf")
    return out


def sample_rows(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
) -> tuple[list[int], list[float]]:
    """Sample one token per row; return the tokens and their behaviour log-probs."""
    # Sampling runs on the CPU with per-request CPU generators, whatever the model's device.
    logits = logits.detach().to("cpu", torch.float32)
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    logprobs = token_logprobs(logits, temps)
    # Rows sampled from the whole distribution (no top-k / top-p) get their probabilities
    # in one batched softmax, the same values row by row; only the draw, which needs the
    # row's own generator, stays per row.
    plain = [
        row
        for row, p in enumerate(params)
        if p.temperature != 0 and not truncates(p.top_k, p.top_p, logprobs.shape[-1])
    ]
    probs = torch.softmax(logprobs[plain], dim=-1) if len(plain) > 1 else None
    plain_index = {row: i for i, row in enumerate(plain)}
    tokens: list[int] = []
    values: list[float] = []
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        lp = logprobs[row]
        if p.temperature == 0:
            tok = int(torch.argmax(lp))
        else:
            if probs is not None and row in plain_index:
                row_probs = probs[plain_index[row]]
            else:
                row_probs = torch.softmax(truncate(lp, p.top_k, p.top_p), dim=-1)
            tok = int(torch.multinomial(row_probs, 1, generator=gen))
        tokens.append(tok)
        values.append(float(lp[tok]))
    return tokens, values


def truncates(top_k: int, top_p: float, vocab: int) -> bool:
    """Whether top-k / top-p remove anything (``truncate`` would change the row)."""
    return bool(top_k and top_k < vocab) or top_p < 1.0
