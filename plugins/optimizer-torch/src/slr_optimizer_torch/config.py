"""``[optimizer]`` options of the embedded torch trainer (``name = "torch"``).

The RL algorithm itself (advantage estimator and its gamma / lam, policy loss, clip ratios,
KL and entropy weights, loss aggregation) lives in the core ``[algorithm]`` section, by
verl's names, shared with every optimizer; this section says how *this* trainer runs it:
model, AdamW, batching, device. docs/training.md maps every option to verl's config path.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from attrs import frozen, validators

from slr.config import option
from slr_optimizer_torch.algorithm_names import ACCEPTS

_MOVED = "moved to [algorithm] (verl's algorithm.{0}, shared with every optimizer): write it there"


@frozen(kw_only=True)
class TrainerOptions:
    """The ``[optimizer]`` options every trainer has, by the same names and meanings (the
    verl optimizer subclasses it too; docs/training.md maps each to verl's config path)."""

    #: the [algorithm] names these trainers run (verl's), checked when a config is loaded
    ACCEPTS: ClassVar[dict[str, tuple[str, ...]]] = ACCEPTS

    lr: float = option(1e-6, doc="AdamW learning rate.", validator=validators.gt(0.0))
    weight_decay: float = option(0.01, doc="AdamW weight decay.", validator=validators.ge(0.0))
    betas: tuple[float, float] = option((0.9, 0.999), doc="AdamW betas.")
    eps: float = option(1e-8, doc="AdamW epsilon.", validator=validators.gt(0.0))
    clip_grad: float = option(
        1.0,
        doc="Clip the global gradient norm to this (0: no clipping).",
        validator=validators.ge(0.0),
    )
    ppo_epochs: int = option(1, doc="Passes over the batch per step.", validator=validators.ge(1))
    ppo_mini_batch_size: int = option(
        0,
        doc="Groups (verl: prompts) per mini-batch, one optimizer update each: an epoch "
        "shuffles the step's groups and splits them into mini-batches of this many (the "
        "last may be smaller). 0: the whole batch, one update per epoch.",
        validator=validators.ge(0),
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
    cliprange_value: float = option(0.5, doc="gae only: verl's value clip range.")
    lora_rank: int = option(
        0,
        doc="LoRA rank (verl's name): > 0 trains only a LoRA adapter (peft) on target_modules, "
        "the base weights frozen, and only the adapter is synced to the engines and "
        "checkpointed; 0: full weights.",
        validator=validators.ge(0),
    )
    lora_alpha: float = option(
        16.0, doc="LoRA alpha: the adapter's output is scaled by lora_alpha / lora_rank."
    )
    target_modules: str | list[str] = option(
        "all-linear",
        doc="Modules LoRA adapts, in peft's spelling: all-linear (every linear layer but the "
        "output head), a list of module names (q_proj, v_proj, ...) or a regular expression.",
    )


@frozen(kw_only=True)
class TorchOptimizerConfig(TrainerOptions):
    RENAMED: ClassVar[dict[str, str]] = {
        "ppo_mini_batches": "it was a count of mini-batches; write ppo_mini_batch_size, "
        "verl's size: groups (prompts) per mini-batch, 0 for the whole batch",
        "grad_clip": "write clip_grad (verl's actor.optim.clip_grad, same meaning)",
        "gamma": _MOVED.format("gamma"),
        "lam": _MOVED.format("lam"),
        "norm_adv_by_std_in_grpo": _MOVED.format("norm_adv_by_std_in_grpo"),
        "kl_loss_type": "moved to [algorithm] (verl's actor.kl_loss_type, beside use_kl_loss "
        "and kl_loss_coef): write it there",
        "loss_scale_factor": "moved to [algorithm] (verl's actor.loss_scale_factor, beside "
        "loss_agg_mode); 0 there is written by leaving it unset",
    }

    model: str = option(
        "",
        doc="Model to train: a Hugging Face model folder (or hub id), or a name the hf engine "
        "resolves (smollm2-135m-instruct, a .gguf file); empty: the engine's [engine] model.",
    )
    ref_model: str = option(
        "",
        doc="Reference model for the KL loss (used when algorithm.use_kl_loss is true); "
        "empty: a frozen copy of the initial policy.",
    )
    device: str = option(
        "auto", doc="torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:1, ..."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", doc="Parameter dtype; float32 on CPU, bfloat16 on a GPU."
    )
    micro_batch_tokens: int = option(
        4096,
        doc="Most tokens in one forward/backward: packed positions of its prefix tree (pack = "
        "tree) or padded tokens, sequences x longest (pack = none); gradients accumulate over "
        "micro-batches. A longer sequence gets a micro-batch of its own.",
        validator=validators.ge(1),
    )
    micro_batch_size: int = option(
        0,
        doc="Most sequences in one micro-batch (0: only the token budget limits it).",
        validator=validators.ge(0),
    )
    pack: Literal["tree", "none"] = option(
        "tree",
        doc="How a micro-batch's rows are computed: tree (rows that share a token prefix, "
        "such as a compacted session's or a sub-agent's segments and a group's common "
        "prompt, are packed into one prefix tree, so shared tokens are computed once) or "
        "none (each row on its own, prefix and all). tree falls back to none, logged, for "
        "a model whose attention cannot take the tree mask exactly.",
    )
    old_logprobs: Literal["recompute", "rollout"] = option(
        "recompute",
        doc="The PPO ratio's denominator: recompute (the trainer's own log-probs before the "
        "update, as verl does) or rollout (the engine's behaviour log-probs).",
    )
    value_coef: float = option(
        0.5, doc="gae only: weight of the value loss (the value head shares the policy's trunk)."
    )
    lora_dropout: float = option(
        0.0,
        doc="Dropout on the adapter's input, in the training forward only (the log-prob "
        "passes and the engines run without it).",
        validator=[validators.ge(0.0), validators.lt(1.0)],
    )
    use_fused_kernels: bool = option(
        False,
        doc="Score tokens with verl's fused linear-for-PPO (its torch backend): log-probs and "
        "entropy from the last hidden states and the output head's weight, a chunk of 512 "
        "positions at a time with the logits recomputed in the backward, so no tokens x "
        "vocabulary tensor is held (the same values to float32 rounding). Needs logits that "
        "are exactly the head's weight applied to the last hidden state (no head bias, no "
        "LoRA on the head, no soft-capping); refused otherwise.",
    )
