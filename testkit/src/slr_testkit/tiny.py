"""Tiny real models for tests: random weights, the SmolLM2 tokenizer and chat template.

Other packages' tests need a model that generates real tokens through the real engine,
fast, and sometimes says something specific (a tool call, a bash block). ``tiny_model``
builds one in a second; ``teach`` trains it for a few seconds on CPU until it emits the
given completions for the given prompts (greedily always, and verbatim at temperature 1
with high probability). ``save`` writes a folder ``HfEngine`` loads like any other model.

    model, tokenizer = tiny_model()
    prompt = chat_prompt(tokenizer, [{"role": "user", "content": "list files"}])
    teach(model, tokenizer, [(prompt, "```bash\\nls\\n```")])
    engine = HfEngine.from_model(model, tokenizer)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from slr_engine_hf.config import DEFAULT_MODEL
from slr_engine_hf.models import MARKER, ensure_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Architecture = Literal["qwen2", "qwen3_moe", "mixtral"]


def tokenizer(name: str = DEFAULT_MODEL) -> Any:
    """The packaged model's tokenizer (with its chat template), cached on first use: from
    the converted model when it is cached, else a tokenizer-only conversion (seconds)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ensure_tokenizer(name)))


def tiny_model(
    architecture: Architecture = "qwen2",
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    experts: int = 4,
    experts_per_token: int = 2,
    max_context: int = 2048,
    seed: int = 0,
    tok: Any = None,
    init_std: float = 0.02,
) -> tuple[PreTrainedModel, Any]:
    """A randomly initialised causal LM of ``architecture`` and the SmolLM2 tokenizer.

    ``qwen3_moe`` and ``mixtral`` build mixture-of-experts models (``experts`` experts,
    ``experts_per_token`` routed per token) for routing-capture tests. ``init_std`` is the
    weights' initialisation scale (transformers' ``initializer_range``): larger makes the
    experts' outputs, and so the choice between them, weigh more in the residual stream.
    """
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2Config, Qwen3MoeConfig

    tok = tok if tok is not None else tokenizer()
    common: dict[str, Any] = dict(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_context,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=init_std,
    )
    if architecture == "qwen2":
        config = Qwen2Config(**common)
    elif architecture == "qwen3_moe":
        config = Qwen3MoeConfig(
            **common,
            # accepted at run time; transformers' annotations of the config omit it
            head_dim=hidden // heads,  # pyright: ignore[reportCallIssue]
            moe_intermediate_size=hidden,
            num_experts=experts,
            num_experts_per_tok=experts_per_token,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )
    elif architecture == "mixtral":
        config = MixtralConfig(
            **common, num_local_experts=experts, num_experts_per_tok=experts_per_token
        )
    else:
        raise ValueError(
            f"unknown tiny architecture {architecture!r}; use 'qwen2', 'qwen3_moe' or 'mixtral'"
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    assert model.generation_config is not None  # every causal LM has one
    model.generation_config.eos_token_id = tok.eos_token_id
    model.eval()
    return model, tok


def chat_prompt(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template, ready for the reply."""
    out = tok.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return [int(t) for t in ids]


def teach(
    model: PreTrainedModel,
    tok: Any,
    examples: Sequence[tuple[Sequence[int], str | Sequence[int]]],
    *,
    steps: int = 300,
    lr: float = 1e-2,
    end_with_eos: bool = True,
    max_token_loss: float = 1e-4,
    seed: int = 0,
) -> float:
    """Train ``model`` to continue each prompt (token ids) with its completion.

    A completion is text (tokenized without special tokens) or token ids; the EOS token is
    appended unless ``end_with_eos`` is false. Training runs until every completion token
    is the clear favourite (probability > 0.95, so greedy decoding reproduces it), then the
    output head is scaled up until every token's loss is under ``max_token_loss`` (the
    default makes sampling at temperature 1 reproduce the text verbatim with probability
    above 99% for completions of up to ~100 tokens). Returns the largest per-token loss
    left. Seconds on CPU for a ``tiny_model``; the model is left in eval mode.
    """
    torch.manual_seed(seed)
    rows, targets = [], []
    for prompt, completion in examples:
        done = (
            tok.encode(completion, add_special_tokens=False)
            if isinstance(completion, str)
            else list(completion)
        )
        if end_with_eos:
            done = [*done, tok.eos_token_id]
        rows.append([*prompt, *done])
        targets.append([-100] * len(prompt) + done)  # the loss covers the completion only
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    # Only completion positions need logits: run the decoder, then the head on those rows.
    decoder = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(
            f"teach needs a model with an output head; {type(model).__name__} has none"
        )
    where = labels[:, 1:] != -100
    wanted = labels[:, 1:][where]

    def per_token_loss() -> torch.Tensor:
        hidden = decoder(input_ids=input_ids, attention_mask=attention).last_hidden_state
        logits = head(hidden[:, :-1][where]).float()
        return torch.nn.functional.cross_entropy(logits, wanted, reduction="none")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only add contention
    try:
        optim = torch.optim.Adam(model.parameters(), lr=lr)
        model.train()
        for _ in range(steps):
            optim.zero_grad()
            losses = per_token_loss()
            if losses.max().item() < 0.05:
                break
            losses.mean().backward()
            optim.step()
        model.eval()
        with torch.no_grad():
            hidden = decoder(input_ids=input_ids, attention_mask=attention).last_hidden_state
            logits = head(hidden[:, :-1][where]).float()
            # Sharpen: scaling a bias-free head by s divides the softmax temperature by s.
            scale = 1.0
            worst = torch.nn.functional.cross_entropy(logits, wanted, reduction="none").max()
            correct = bool((logits.argmax(-1) == wanted).all())
            while correct and worst.item() >= max_token_loss and scale < 64:
                scale *= 1.5
                worst = torch.nn.functional.cross_entropy(
                    logits * scale, wanted, reduction="none"
                ).max()
            if scale != 1.0 and getattr(head, "bias", None) is None:
                if model.config.get_text_config().tie_word_embeddings:
                    raise ValueError("teach needs an untied output head to sharpen it")
                head.weight.mul_(scale)
    finally:
        torch.set_num_threads(threads)
    return float(worst.item())


def pretrain(
    model: PreTrainedModel,
    tok: Any,
    text: str,
    *,
    steps: int = 40,
    window: int = 128,
    batch: int = 8,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """A few next-token-prediction steps on ``text`` (windows of ``window`` tokens, Adam),
    so a random model stops being uniform: a MoE model's routers learn to prefer experts
    per token, as a trained model's do. Returns the loss of each step; eval mode after."""
    ids = torch.tensor(tok.encode(text, add_special_tokens=False), dtype=torch.long)
    if len(ids) <= window:
        raise ValueError(f"pretrain needs more than {window} tokens of text; got {len(ids)}")
    g = torch.Generator().manual_seed(seed)
    optim = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - window, (batch,), generator=g)
        rows = torch.stack([ids[int(s) : int(s) + window] for s in starts])
        optim.zero_grad()
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        optim.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def save(model: PreTrainedModel, tok: Any, folder: str | os.PathLike[str]) -> Path:
    """Write a model folder that ``HfEngine(HfEngineConfig(model=str(folder)))`` loads."""
    path = Path(folder)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    (path / MARKER).write_text(json.dumps({"source": "tiny"}) + "\n")
    return path
