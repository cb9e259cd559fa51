"""The ``hf`` engine's options. Light on purpose: loading the plugin must not import torch."""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators

from slr.config import option

DEFAULT_MODEL = "smollm2-135m-instruct"


@frozen(kw_only=True)
class HfEngineConfig:
    """Options of the ``hf`` engine (the ``[engine]`` section when ``name = "hf"``)."""

    model: str = option(
        DEFAULT_MODEL,
        doc="'smollm2-135m-instruct' (the packaged model, converted once into the cache), "
        "a local Hugging Face model folder, or a .gguf file.",
    )
    device: str = option("cpu", doc="Torch device: 'cpu', 'cuda' or 'cuda:N'.")
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", doc="Weights and compute dtype. float32 keeps log-probs exact on CPU."
    )
    max_context: int = option(
        0,
        doc="Most tokens (prompt + completion) per sequence; 0 means the model's own limit.",
        validator=validators.ge(0),
    )
    max_batch: int = option(
        32,
        doc="Most sequences decoded together in one step (more sessions wait for a free row; "
        "the decode attention's length buckets keep a step at 32 rows of unequal contexts "
        "near 6x one row's cost on CPU, docs/engines.md).",
        validator=validators.ge(1),
    )
    prefix_cache_tokens: int = option(
        16384,
        doc="Tokens of KV kept in the shared prefix cache (a radix tree over token ids, "
        "shared by all sessions, least recently used evicted first): a prompt runs only the "
        "tokens after its longest cached prefix (0: off). SmolLM2-135M in fp32 needs ~46 KB "
        "per token.",
        validator=validators.ge(0),
    )
    return_routed_experts: bool = option(
        False,
        doc="For mixture-of-experts models: record each token's top-k expert ids per MoE "
        "layer in Generation.routed_experts.",
    )
    threads: int = option(
        0, doc="torch CPU threads (0: leave torch's default).", validator=validators.ge(0)
    )
