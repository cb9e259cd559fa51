"""The ``[optimizer]`` options in verl's terms, both ways, and the verl configs built from them.

``VERL_PATHS`` names each option's path in verl's trainer config (``ppo_trainer.yaml``), the
same paths docs/training.md's table gives for the torch optimizer's options of the same
name; options verl has no path for (``eps`` goes into verl's
``override_optimizer_config``; the rest are slr's own) are left out. ``to_verl`` writes an
options object as ``{path: value}`` in verl's spelling of the values (``fp32``, lists);
``from_verl`` reads such a mapping (flat paths, or nested as in verl's yaml) back, so a verl
user's settings carry over and an slr config can be shown as verl would write it.

``worker_config`` builds the real classes verl's ``TrainingWorker`` takes (model, FSDP
engine, optimizer, checkpoint configs) and ``actor_config`` the ``ActorConfig`` verl's
``ppo_loss`` reads, so every name and default below is verl's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from slr_optimizer_torch.correction import Correction
from slr_optimizer_torch.verl_config import loss_fields

from slr.config import AlgorithmSection
from slr.errors import ConfigError
from slr_optimizer_verl.config import VerlOptimizerConfig

VERL_PATHS: dict[str, str] = {
    "model": "actor_rollout_ref.model.path",
    "device": "trainer.device",
    "dtype": "actor_rollout_ref.actor.fsdp_config.model_dtype",
    "strategy": "actor_rollout_ref.actor.strategy",
    "world_size": "trainer.n_gpus_per_node",
    "lr": "actor_rollout_ref.actor.optim.lr",
    "weight_decay": "actor_rollout_ref.actor.optim.weight_decay",
    "betas": "actor_rollout_ref.actor.optim.betas",
    "clip_grad": "actor_rollout_ref.actor.optim.clip_grad",
    "micro_batch_tokens": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "ppo_epochs": "actor_rollout_ref.actor.ppo_epochs",
    "ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "old_logprobs": "algorithm.rollout_correction.bypass_mode",
    "gradient_checkpointing": "actor_rollout_ref.model.enable_gradient_checkpointing",
    "lora_rank": "actor_rollout_ref.model.lora_rank",
    "lora_alpha": "actor_rollout_ref.model.lora_alpha",
    "target_modules": "actor_rollout_ref.model.target_modules",
    "use_fused_kernels": "actor_rollout_ref.model.use_fused_kernels",
    "cliprange_value": "critic.cliprange_value",
    "critic_model": "critic.model.path",
    "critic_lr": "critic.optim.lr",
}

#: slr's spelling -> verl's, per option whose values verl spells differently.
_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_VALUES: dict[str, dict[Any, Any]] = {
    "dtype": _DTYPES,
    "old_logprobs": {"recompute": False, "rollout": True},
}


def to_verl(options: VerlOptimizerConfig) -> dict[str, Any]:
    """``{verl config path: value}`` for every option verl has a path for."""
    out: dict[str, Any] = {}
    for name, path in VERL_PATHS.items():
        value = getattr(options, name)
        if isinstance(value, (tuple, list)):
            out[path] = list(value)
            continue
        out[path] = _VALUES.get(name, {}).get(value, value)
    return out


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and path not in VERL_PATHS.values():
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def from_verl(
    settings: Mapping[str, Any], base: VerlOptimizerConfig | None = None
) -> VerlOptimizerConfig:
    """Options from verl's config paths (flat ``a.b.c`` keys, or nested as in verl's yaml).

    Paths this optimizer has no option for are ignored (verl's config has hundreds);
    a value that does not fit the option fails naming the path and the option.
    """
    flat = _flatten(settings)
    changes: dict[str, Any] = {}
    for name, path in VERL_PATHS.items():
        if path not in flat:
            continue
        value = flat[path]
        back = {v: k for k, v in _VALUES.get(name, {}).items()}
        if back:
            if value not in back:
                raise ConfigError(
                    f"verl's {path} = {value!r} has no [optimizer] {name} counterpart; "
                    f"use one of {sorted(map(repr, back))}"
                )
            value = back[value]
        if name == "betas":
            value = tuple(value)
        if name == "target_modules" and not isinstance(value, str):
            value = list(value)
        changes[name] = value
    try:
        return attrs.evolve(base or VerlOptimizerConfig(), **changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"verl settings do not make valid [optimizer] options: {exc}") from exc


def actor_config(
    algorithm: AlgorithmSection, options: VerlOptimizerConfig, correction: Correction | None = None
) -> Any:
    """verl's ``ActorConfig``: what its ``ppo_loss`` and policy losses read; in rollout
    correction's bypass mode its policy loss is verl's ``bypass_mode`` (``apply_bypass_mode``)."""
    from verl.workers.config.actor import ActorConfig

    return ActorConfig(
        strategy=options.strategy,
        rollout_n=1,  # groups come from the trials' group ids, not a fixed n
        ppo_mini_batch_size=1,  # sizes are set per call (rows), not from here
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=options.micro_batch_tokens,
        use_torch_compile=False,
        **loss_fields(algorithm, correction, ppo_epochs=options.ppo_epochs),
    )


def _model(
    options: VerlOptimizerConfig, path: str, *, lora: bool, tokenizer_path: str | None = None
) -> Any:
    from verl.workers.config import HFModelConfig

    extra: dict[str, Any] = {}
    if lora and options.lora_rank > 0:
        extra.update(
            lora_rank=options.lora_rank,
            lora_alpha=options.lora_alpha,
            target_modules=options.target_modules,
        )
    return HFModelConfig(
        path=path,
        tokenizer_path=tokenizer_path,
        use_remove_padding=False,  # verl's no-padding path needs flash-attn's varlen kernels
        enable_gradient_checkpointing=options.gradient_checkpointing,
        override_config={"attn_implementation": options.attn_implementation},
        use_fused_kernels=options.use_fused_kernels,
        fused_kernel_options={"impl_backend": "torch"},
        **extra,
    )


def _engine(options: VerlOptimizerConfig, device: str, *, forward_only: bool = False) -> Any:
    from verl.workers.config import FSDPEngineConfig

    dtype = _DTYPES[options.dtype]
    return FSDPEngineConfig(
        strategy=options.strategy,
        model_dtype=dtype,
        # verl's default mixed precision computes in bf16; the parameters' dtype throughout
        mixed_precision={"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        use_dynamic_bsz=True,
        max_token_len_per_gpu=options.micro_batch_tokens,
        infer_max_token_len_per_gpu=options.micro_batch_tokens,
        use_torch_compile=device != "cpu",
        seed=options.seed,
        forward_only=forward_only,
    )


def _optimizer(options: VerlOptimizerConfig, lr: float) -> Any:
    from verl.workers.config import FSDPOptimizerConfig

    return FSDPOptimizerConfig(
        lr=lr,
        weight_decay=options.weight_decay,
        betas=(options.betas[0], options.betas[1]),
        # verl hands clip_grad to clip_grad_norm_, where 0 would zero every gradient
        clip_grad=options.clip_grad if options.clip_grad > 0 else float("inf"),
        override_optimizer_config={"eps": options.eps},
        lr_scheduler_type="constant",
    )


def worker_config(options: VerlOptimizerConfig, *, model_path: str, device: str) -> Any:
    """verl's ``TrainingWorkerConfig`` for the actor: model (LoRA and fused kernels as
    configured), FSDP engine, AdamW, checkpoints."""
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import TrainingWorkerConfig

    lora = options.lora_rank > 0
    checkpoint = CheckpointConfig(
        # with LoRA only the adapter trains: verl saves it alone (the base is the model
        # folder) and the servable weights are the adapter folder (checkpoint.py)
        save_contents=["model", "optimizer", "extra"] + ([] if lora else ["hf_model"]),
        load_contents=["model", "optimizer", "extra"],
        save_lora_only=lora,
    )
    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=_model(options, model_path, lora=True),
        engine_config=_engine(options, device),
        optimizer_config=_optimizer(options, options.lr),
        checkpoint_config=checkpoint,
    )


def ref_worker_config(options: VerlOptimizerConfig, *, model_path: str, device: str) -> Any:
    """verl's reference worker (``ActorRolloutRefWorker.init_model``'s ``ref``): the initial
    policy, never trained, read by ``infer_batch`` only.

    verl builds it ``forward_only``, which in its FSDP2 engine means parameters offloaded with
    ``CPUOffloadPolicy(pin_memory=True)`` (``verl/workers/engine/fsdp/transformer_impl.py``,
    ``_build_fsdp_module``: ``if self.engine_config.offload_policy or
    self.engine_config.forward_only``), and pinning host memory needs an accelerator. On the
    CPU the parameters are in host memory anyway: the reference is built as a training
    engine that is never stepped (its AdamW holds no state until a step, so it costs nothing).
    """
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import TrainingWorkerConfig

    forward_only = device != "cpu"
    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=_model(options, model_path, lora=False),
        engine_config=_engine(options, device, forward_only=forward_only),
        optimizer_config=None if forward_only else _optimizer(options, options.lr),
        checkpoint_config=CheckpointConfig(save_contents=[], load_contents=[]),
    )


def critic_worker_config(
    options: VerlOptimizerConfig, *, model_path: str, tokenizer_path: str, device: str
) -> Any:
    """verl's critic worker (``RayPPOTrainer.init_workers``: a ``TrainingWorker`` of
    ``model_type = "value_model"``): its own model (the policy's tokenizer, as verl's
    ``critic.model.tokenizer_path`` defaults) and AdamW (``critic_lr``)."""
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import TrainingWorkerConfig

    options = attrs.evolve(options, use_fused_kernels=False)
    model = _model(options, model_path, lora=False, tokenizer_path=tokenizer_path)
    return TrainingWorkerConfig(
        model_type="value_model",
        model_config=model,
        engine_config=_engine(options, device),
        optimizer_config=_optimizer(options, options.critic_lr),
        checkpoint_config=CheckpointConfig(
            save_contents=["model", "optimizer", "extra"],
            load_contents=["model", "optimizer", "extra"],
        ),
    )


def critic_config(algorithm: AlgorithmSection, options: VerlOptimizerConfig) -> Any:
    """verl's ``CriticConfig``: what its ``value_loss`` reads (clip range, aggregation)."""
    from verl.workers.config import FSDPCriticConfig

    return FSDPCriticConfig(
        strategy=options.strategy,
        rollout_n=1,
        ppo_mini_batch_size=1,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=options.micro_batch_tokens,
        ppo_epochs=options.ppo_epochs,
        cliprange_value=options.cliprange_value,
        loss_agg_mode=algorithm.loss_agg_mode,
        loss_scale_factor=algorithm.loss_scale_factor,
    )
