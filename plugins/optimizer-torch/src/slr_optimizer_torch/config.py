"""``[optimizer]`` options of the embedded torch trainer (``name = "torch"``).

The RL algorithm itself (advantage estimator, policy loss, clip ratios, KL and entropy
weights, loss aggregation) lives in the core ``[algorithm]`` section, shared with the cluster
optimizer; this section says how *this* trainer runs it: model, AdamW, batching, device.
"""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators

from slr.config import option


@frozen(kw_only=True)
class TorchOptimizerConfig:
    model: str = option(
        "",
        doc="Model to train: a Hugging Face model folder (or hub id), or a name the hf engine "
        "resolves (smollm2-135m-instruct, a .gguf file); empty: the engine's [engine] model.",
    )
    ref_model: str = option(
        "",
        doc="Reference model for the KL penalty (used when algorithm.kl_coef > 0); empty: a "
        "frozen copy of the initial policy.",
    )
    device: str = option(
        "auto", doc="torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:1, ..."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", doc="Parameter dtype; float32 on CPU, bfloat16 on a GPU."
    )
    lr: float = option(1e-6, doc="AdamW learning rate.", validator=validators.gt(0.0))
    weight_decay: float = option(0.01, doc="AdamW weight decay.", validator=validators.ge(0.0))
    betas: tuple[float, float] = option((0.9, 0.999), doc="AdamW betas.")
    eps: float = option(1e-8, doc="AdamW epsilon.", validator=validators.gt(0.0))
    grad_clip: float = option(
        1.0,
        doc="Clip the global gradient norm to this (0: no clipping).",
        validator=validators.ge(0.0),
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
    ppo_epochs: int = option(1, doc="Passes over the batch per step.", validator=validators.ge(1))
    ppo_mini_batches: int = option(
        1,
        doc="Optimizer updates per epoch: the batch's trials are shuffled and split into this "
        "many mini-batches.",
        validator=validators.ge(1),
    )
    old_logprobs: Literal["recompute", "rollout"] = option(
        "recompute",
        doc="The PPO ratio's denominator: recompute (the trainer's own log-probs before the "
        "update, as verl does) or rollout (the engine's behaviour log-probs).",
    )
    drop_zero_variance_groups: bool = option(
        True,
        doc="Leave out groups of two or more trials whose rewards are all equal (they carry no "
        "group-relative signal); they are counted in the metrics either way.",
    )
    norm_adv_by_std_in_grpo: bool = option(
        True, doc="GRPO: divide by the group's reward std (false: Dr. GRPO)."
    )
    gamma: float = option(1.0, doc="Discount for gae and reinforce_plus_plus.")
    lam: float = option(1.0, doc="GAE lambda.")
    kl_loss_type: str = option(
        "low_var_kl",
        doc="verl KL estimator for the reference penalty: kl (k1), mse (k2), low_var_kl (k3), ...",
    )
    value_coef: float = option(
        0.5, doc="gae only: weight of the value loss (the value head shares the policy's trunk)."
    )
    cliprange_value: float = option(0.5, doc="gae only: verl's value clip range.")
    loss_scale_factor: int = option(
        0,
        doc="seq-mean-token-sum-norm divisor (0: the mini-batch's longest row). Set it for a "
        "normalisation constant across steps.",
        validator=validators.ge(0),
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
