"""``[optimizer]`` options of the verl optimizer (``name = "verl"``).

An option that both trainers have keeps the torch optimizer's name and meaning (the verl
name table in docs/training.md); ``verl_names.py`` maps each to verl's config path and
back. The RL algorithm itself lives in the core ``[algorithm]`` section, shared with every
optimizer.
"""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators

from slr.config import option


@frozen(kw_only=True)
class VerlOptimizerConfig:
    model: str = option(
        "",
        doc="Model to train: a Hugging Face model folder, or a name the hf engine resolves "
        "(smollm2-135m-instruct, a .gguf file); empty: the engine's [engine] model.",
    )
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto",
        doc="Where verl's engine runs: cpu (verl's platform plugin 'cpu', gloo collectives), "
        "cuda (verl's own nvidia platform, nccl), auto (cuda when available, else cpu).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32",
        doc="Parameter and compute dtype (verl's model_dtype and FSDP mixed precision); "
        "float32 on CPU, bfloat16 on a GPU.",
    )
    strategy: Literal["fsdp2", "fsdp"] = option(
        "fsdp2", doc="verl's FSDP version: fsdp2 (per-parameter DTensor sharding) or fsdp (FSDP1)."
    )
    world_size: int = option(
        1,
        doc="Ranks of verl's worker group (one process each); 1: this process alone.",
        validator=validators.ge(1),
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = option(
        "sdpa",
        doc="Attention kernel of the trained model (verl's default, flash_attention_2, needs "
        "the flash-attn package and a GPU).",
    )
    lr: float = option(1e-6, doc="AdamW learning rate.", validator=validators.gt(0.0))
    weight_decay: float = option(0.01, doc="AdamW weight decay.", validator=validators.ge(0.0))
    betas: tuple[float, float] = option((0.9, 0.999), doc="AdamW betas.")
    eps: float = option(1e-8, doc="AdamW epsilon.", validator=validators.gt(0.0))
    clip_grad: float = option(
        1.0,
        doc="Clip the global gradient norm to this (0: no clipping).",
        validator=validators.ge(0.0),
    )
    micro_batch_tokens: int = option(
        4096,
        doc="Most tokens (without padding) in one forward/backward: verl's dynamic batch "
        "size; gradients accumulate over micro-batches.",
        validator=validators.ge(1),
    )
    ppo_epochs: int = option(1, doc="Passes over the batch per step.", validator=validators.ge(1))
    ppo_mini_batch_size: int = option(
        0,
        doc="Groups (verl: prompts) per mini-batch, one optimizer update each: an epoch "
        "shuffles the step's groups and splits them into mini-batches of this many (the "
        "last may be smaller). 0: the whole batch, one update per epoch.",
        validator=validators.ge(0),
    )
    old_logprobs: Literal["recompute", "rollout"] = option(
        "recompute",
        doc="The PPO ratio's denominator: recompute (verl's forward-only pass before the "
        "update) or rollout (the engine's behaviour log-probs).",
    )
    drop_zero_variance_groups: bool = option(
        True,
        doc="Leave out groups of two or more trials whose rewards are all equal (they carry no "
        "group-relative signal); they are counted in the metrics either way.",
    )
    gradient_checkpointing: bool = option(
        False, doc="Trade compute for memory in the forward/backward."
    )
    pass_threshold: float = option(
        1.0, doc="A trial counts as passed in the metrics when its reward is at least this."
    )
    seed: int = option(
        0, doc="Seed for mini-batch shuffling (saved and restored with checkpoints)."
    )
    weight_bucket_bytes: int = option(
        256 * 1024 * 1024,
        doc="Most bytes in one bucket of weights published to the engines (weight_buckets).",
        validator=validators.ge(1),
    )
