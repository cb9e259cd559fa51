"""Helpers for the adapter end-to-end tests: a taught tiny policy."""

from __future__ import annotations

import hashlib
import inspect
import os
import random
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from slr_engine_hf.engine import HfEngine
from slr_engine_hf.models import MARKER, cache_dir

from slr_testkit.tiny import chat_prompt, save, teach, tokenizer

#: The action that solves examples/tasks/hello-world, in every scaffold's format.
HELLO = "printf 'hello\\n' > /app/hello.txt"

#: Attention window of the taught policy, one layer deep. At the first token it sees the
#: generation prompt ``<|im_end|>\n<|im_start|>assistant\n`` (6 tokens) and the two tokens
#: before it: enough to tell a tool result (``</tool_response>``) from anything else, too
#: little for the rest of a scaffold's prompt to change what the policy says. Taught on
#: short prompts, it answers the same inside a 10k-token scaffold prompt.
WINDOW = 8
#: The output head starts this much sharper than a fresh one: a fresh head's logits are
#: so flat that the body needs hundreds of steps to grow them after it already has every
#: token right (the loss then only falls linearly); scaled, teaching converges in ~20 steps.
HEAD_SCALE = 30.0
_RECIPE = "sliding-w8-l1-h64-frozen-io-v3"


def _model(tok: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
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
    # Only the decoder layer learns: random fixed embeddings tell tokens apart well enough,
    # and the 49k-row embedding and head would be most of each step's work.
    model.get_input_embeddings().weight.requires_grad_(False)
    head = model.get_output_embeddings()
    head.weight.requires_grad_(False)
    with torch.no_grad():
        head.weight.mul_(HEAD_SCALE)
    return model


def _examples(tok: Any, action: str, after_result: str | None) -> list[tuple[list[int], list[int]]]:
    """First turns (a random instruction) answered with ``action``; with ``after_result``,
    turns that follow a tool result (rendered as the proxy renders it) answered with it.

    Past its first two tokens a reply's window holds nothing of the prompt but the
    generation prompt, so only a few examples carry a whole reply (and its EOS); the many
    that teach it to ignore what comes before carry just the reply's first tokens.
    """
    rng = random.Random(0)
    words = list(range(300, 40000))
    eos = tok.eos_token_id

    def text(lo: int, hi: int) -> str:
        # random words, ending as instructions and reminders do
        end = rng.choice(["", ".", ".\n", "`.", '"', ">", "\n\n", ")"])
        return tok.decode(rng.sample(words, rng.randint(lo, hi))) + end

    def reply(said: str, k: int) -> list[int]:
        ids = [*tok.encode(said, add_special_tokens=False), eos]
        return ids if k < 4 else ids[:3]

    out = []
    for k in range(32):
        system = [{"role": "system", "content": text(1, 9)}] if rng.random() < 0.5 else []
        prompt = chat_prompt(tok, [*system, {"role": "user", "content": text(1, 20)}])
        out.append((prompt, reply(action, k)))
    if after_result is not None:
        for k in range(12):
            output = ["", "\n", "(no output)"][k] if k < 3 else text(1, 9)
            history = [
                {"role": "user", "content": text(1, 30)},
                {"role": "assistant", "content": action},
                {"role": "user", "content": f"<tool_response>\n{output}\n</tool_response>"},
            ]
            out.append((chat_prompt(tok, history), reply(after_result, k)))
    return out


def taught_model(action: str, *, after_result: str | None = None) -> Path:
    """A folder with a tiny policy that answers ``action`` to any chat prompt, and with
    ``after_result`` (when given) to a turn that ends in a tool result.

    Taught once (seconds, deterministic) and cached on disk by the hash of the recipe
    (``<slr cache>/models/taught-<hash>``), so later test sessions load it in a second.
    """
    parts = [_model, _examples, teach]
    tok = tokenizer()
    # the tokenizer's special tokens are part of the recipe: a policy taught under another
    # eos (a wrongly converted tokenizer) stops in the wrong place
    special = f"eos={tok.eos_token!r} bos={tok.bos_token!r} pad={tok.pad_token!r}"
    recipe = "\n".join(
        [_RECIPE, *map(inspect.getsource, parts), action, repr(after_result), special]
    )
    key = hashlib.sha256(recipe.encode()).hexdigest()[:16]
    folder = cache_dir() / "models" / f"taught-{key}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not (folder / MARKER).is_file():
            model = _model(tok)
            worst = teach(
                model,
                tok,
                _examples(tok, action, after_result),
                end_with_eos=False,  # the examples say where EOS comes
                steps=300,
                lr=1e-2,
                max_token_loss=1e-6,
            )
            # Every token at probability > 1 - 1e-6: sampled verbatim, even at temperature 1.
            assert worst < 1e-6, f"teaching {action!r} did not converge (worst loss {worst:.3g})"
            tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
            save(model, tok, tmp)
            tmp.rename(folder)
    _check(folder, tok, action, after_result)
    return folder


def _check(folder: Path, tok: Any, action: str, after_result: str | None) -> None:
    """Fail here, by name, when the teaching did not take: a scaffold run would only show
    reward 0 after minutes. Probed on prompts it was not taught on."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    instruction = "Create a file named `hello.txt` in /app whose content is the word `hello`."
    probes = [([{"role": "user", "content": instruction}], action)]
    if after_result is not None:
        probes.append(
            (
                [
                    {"role": "user", "content": instruction},
                    {"role": "assistant", "content": action},
                    {"role": "user", "content": "<tool_response>\n(no output)\n</tool_response>"},
                ],
                after_result,
            )
        )
    for messages, want in probes:
        ids = chat_prompt(tok, messages)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=200,
                do_sample=False,
            )
        said = tok.decode(out[0][len(ids) :], skip_special_tokens=True)
        assert said == want, f"the taught policy says {said!r}, not {want!r} ({folder})"


def taught_engine(action: str, *, after_result: str | None = None) -> HfEngine:
    """An in-process engine serving ``taught_model(action, after_result=...)``."""
    from transformers import AutoModelForCausalLM

    folder = taught_model(action, after_result=after_result)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return HfEngine.from_model(model, tokenizer())
