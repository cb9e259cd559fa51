"""Helpers for the adapter end-to-end tests: a taught tiny policy."""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

import torch
from filelock import FileLock
from slr_engine_hf.engine import HfEngine
from slr_engine_hf.models import cache_dir
from slr_engine_hf.tiny import chat_prompt, save, teach, tokenizer

#: The action that solves examples/tasks/hello-world, in every scaffold's format.
HELLO = "printf 'hello\\n' > /app/hello.txt"

#: Attention window of the taught policy, one layer deep: exactly the generation prompt
#: ``<|im_end|>\n<|im_start|>assistant\n`` at the first token, so nothing before it (the
#: scaffold's whole prompt) can change what the policy says.
WINDOW = 5
_RECIPE = "sliding-w5-l1-v1"


def _model(tok: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=65536,
        tie_word_embeddings=False,  # teach sharpens an untied output head
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=0,
        layer_types=["sliding_attention"],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def taught_engine(action: str) -> HfEngine:
    """An engine serving a tiny policy that answers ``action`` to any chat prompt.

    Taught once per action and cached on disk (``<slr cache>/models/taught-<hash>``), so
    later test sessions load it in a second.
    """
    from transformers import AutoModelForCausalLM

    key = hashlib.sha256(f"{_RECIPE}\n{action}".encode()).hexdigest()[:16]
    folder = cache_dir() / "models" / f"taught-{key}"
    tok = tokenizer()
    with FileLock(str(folder) + ".lock"):
        if not (folder / "slr-model.json").is_file():
            model = _model(tok)
            rng = random.Random(0)
            words = list(range(300, 40000))
            prompts = [
                chat_prompt(
                    tok,
                    [
                        {
                            "role": "user",
                            "content": tok.decode(rng.sample(words, rng.randint(3, 30))),
                        }
                    ],
                )
                for _ in range(3)
            ]
            teach(model, tok, [(p, action) for p in prompts], steps=800, lr=3e-2)
            tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
            save(model, tok, tmp)
            tmp.rename(folder)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    # Fail here, by name, when the teaching did not take: a scaffold run would only show
    # reward 0 after minutes.
    probe = chat_prompt(tok, [{"role": "user", "content": "Create hello.txt containing hello."}])
    with torch.no_grad():
        out = model.generate(torch.tensor([probe]), max_new_tokens=200, do_sample=False)
    said = tok.decode(out[0][len(probe) :], skip_special_tokens=True)
    assert said == action, f"the taught policy says {said!r}, not {action!r} ({folder})"
    return HfEngine.from_model(model, tok)
