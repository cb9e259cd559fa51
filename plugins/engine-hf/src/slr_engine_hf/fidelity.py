"""The embedded engine's side of the fidelity matrix (``slr.testing.fidelity``).

One tiny random fp32 model over SmolLM2's tokenizer extended with every family's tokens,
served by one ``HfEngine`` per chat-template family, and the trainer's scoring function: a
plain forward pass over a whole segment. Forced decoding makes the replies fixed, so an
untrained model is enough: the checks compare the proxy's capture with the engine's output
and with that forward pass, not the answers' quality.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from slr.testing.fidelity import family_tokenizers
from slr_engine_hf import tiny
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine


def matrix_engines(
    templates: dict[str, str | None], *, seed: int = 0
) -> tuple[dict[str, HfEngine], Callable[[list[int]], list[float]]]:
    """family -> engine (each with that family's template), and ``score(ids)``: the log-prob
    of every token given the ones before it (0.0 for the first), at temperature 1."""
    toks = family_tokenizers(tiny.tokenizer(), templates)
    some = next(iter(toks.values()))
    model, _ = tiny.tiny_model(tok=some, seed=seed, max_context=4096)
    engines = {
        family: HfEngine.from_model(model, tok, HfEngineConfig(max_batch=4))
        for family, tok in toks.items()
    }

    def score(ids: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        picked = lp[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
        return [0.0, *(float(x) for x in picked)]

    return engines, score


async def close_all(engines: dict[str, Any]) -> None:
    for engine in engines.values():
        await engine.close()
