"""The trainer's view of a generation's log-probs, for engine tests: what an engine reports
for each sampled token must equal ``log_softmax(logits / T)`` of one fp32 forward pass over
prompt + completion (``slr.contracts.Engine``'s definition), compared by max |diff| and
Pearson correlation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def reference_logprobs(
    model: Any, prompt: Sequence[int], tokens: Sequence[int], temperature: float
) -> list[float]:
    """``log_softmax(logits / T)`` of each of ``tokens`` after ``prompt``, one forward pass
    of ``model`` (a transformers causal LM); ``T = 0`` (greedy) reads as 1."""
    import torch

    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    start = len(prompt) - 1
    return [float(lp[start + i, t]) for i, t in enumerate(tokens)]


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest |a[i] - b[i]| of two equally long series."""
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson correlation of two equally long series (float64)."""
    import torch

    return float(torch.corrcoef(torch.tensor([list(a), list(b)], dtype=torch.float64))[0, 1])
