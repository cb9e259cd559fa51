"""``[optimizer]`` options of the verl optimizer (``name = "verl"``).

An option that both trainers have is declared once, with the torch optimizer's name and
meaning, in ``slr_optimizer_torch.config.TrainerOptions`` (the verl name table in
docs/training.md); ``verl_names.py`` maps each to verl's config path and back. The RL algorithm itself lives in the core ``[algorithm]`` section, shared with every
optimizer.
"""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators
from slr_optimizer_torch.config import TrainerOptions

from slr.config import option


@frozen(kw_only=True)
class VerlOptimizerConfig(TrainerOptions):
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
        doc="Ranks of verl's worker group, FSDP over them: 1 is verl's worker in this "
        "process; N >= 2 are N Ray actors (one process each, on one node of the run's Ray, "
        "[run] ray_address), each asking CPU = 1 (and GPU = 1 on cuda).",
        validator=validators.ge(1),
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = option(
        "sdpa",
        doc="Attention kernel of the trained model (verl's default, flash_attention_2, needs "
        "the flash-attn package and a GPU).",
    )
    micro_batch_tokens: int = option(
        4096,
        doc="Most tokens (without padding) in one forward/backward: verl's dynamic batch "
        "size; gradients accumulate over micro-batches.",
        validator=validators.ge(1),
    )
    old_logprobs: Literal["recompute", "rollout"] = option(
        "recompute",
        doc="The PPO ratio's denominator: recompute (verl's forward-only pass before the "
        "update) or rollout (the engine's behaviour log-probs).",
    )
    use_fused_kernels: bool = option(
        False,
        doc="verl's fused log-prob path in its FSDP engine (model.use_fused_kernels, the torch "
        "backend): log-probs and entropy from the last hidden states and the output head, a "
        "chunk at a time, so no tokens x vocabulary logits tensor is held.",
    )
    critic_model: str = option(
        "",
        doc="gae only: the critic's model folder (verl's critic.model.path); empty: the "
        "policy's model, with a new value head (num_labels = 1) as verl loads it.",
    )
    critic_lr: float = option(
        1e-5,
        doc="gae only: the critic's AdamW learning rate (verl's critic.optim.lr); its other "
        "AdamW settings are the policy's.",
        validator=validators.gt(0.0),
    )
    weight_bucket_bytes: int = option(
        256 * 1024 * 1024,
        doc="Most bytes in one bucket of weights published to the engines (weight_buckets).",
        validator=validators.ge(1),
    )
