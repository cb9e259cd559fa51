"""The embedded engine's side of the fidelity matrix (``slr_testkit.fidelity``).

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
from slr_engine_hf.config import HfEngineConfig
from slr_engine_hf.engine import HfEngine

from slr_testkit import tiny
from slr_testkit.fidelity import family_tokenizers


def matrix_engines(
    templates: dict[str, str | None], *, seed: int = 0
) -> tuple[dict[str, HfEngine], Callable[[list[int], list[int]], list[float]]]:
    """family -> engine (each with that family's template), and ``score(ids, positions)``:
    the log-prob of ``ids[j]`` given ``ids[:j]`` for each ``j`` in ``positions`` (all > 0),
    at temperature 1, from one forward pass."""
    toks = family_tokenizers(tiny.tokenizer(), templates)
    some = next(iter(toks.values()))
    model, _ = tiny.tiny_model(tok=some, seed=seed, max_context=4096)
    engines = {
        family: HfEngine.from_model(model, tok, HfEngineConfig(max_batch=4))
        for family, tok in toks.items()
    }

    def score(ids: list[int], positions: list[int]) -> list[float]:
        with torch.no_grad():
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            # only the rows that predict the tokens asked about go through the output head
            rows = hidden[torch.tensor(positions) - 1]
            lp = torch.log_softmax(model.lm_head(rows).float(), dim=-1)
        picked = lp.gather(1, torch.tensor([ids[j] for j in positions]).unsqueeze(1))
        return [float(x) for x in picked.squeeze(1)]

    return engines, score


async def close_all(engines: dict[str, Any]) -> None:
    for engine in engines.values():
        await engine.close()
