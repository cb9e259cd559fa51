"""The slr config in verl's terms: the configs verl's registered functions read.

verl's policy losses read clip ratios, the loss mode and the global-batch normalisation from
an ``ActorConfig``; its advantage estimators read gamma / lam / GRPO's std normalisation from
an ``AlgoConfig``. Building the real classes (not look-alike dicts) keeps every registered
function usable by name, ``gspo`` included, and the names and defaults identical to the
cluster path.
"""

from __future__ import annotations

from typing import Any

from slr.config import AlgorithmSection
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.correction import Correction, policy_loss_config


def loss_fields(
    algorithm: AlgorithmSection, correction: Correction | None, *, ppo_epochs: int
) -> dict[str, Any]:
    """The ``ActorConfig`` fields verl's ``ppo_loss`` and policy losses read, from
    ``[algorithm]``: the same for every trainer that builds an ``ActorConfig`` (this one and
    slr-optimizer-verl); in bypass mode the policy loss is verl's ``bypass_mode``."""
    return {
        "clip_ratio": algorithm.clip_ratio_low,
        "clip_ratio_low": algorithm.clip_ratio_low,
        "clip_ratio_high": algorithm.clip_ratio_high,
        "policy_loss": policy_loss_config(correction, algorithm.policy_loss),
        "loss_agg_mode": algorithm.loss_agg_mode,
        "entropy_coeff": algorithm.entropy_coeff,
        "use_kl_loss": algorithm.use_kl_loss,
        "kl_loss_coef": algorithm.kl_loss_coef,
        "kl_loss_type": algorithm.kl_loss_type,
        "ppo_epochs": ppo_epochs,
        "loss_scale_factor": algorithm.loss_scale_factor,
    }


def actor_config(
    algorithm: AlgorithmSection,
    options: TorchOptimizerConfig,
    correction: Correction | None = None,
) -> Any:
    """verl's ``ActorConfig``; in bypass mode its policy loss is verl's ``bypass_mode``."""
    from verl.workers.config.actor import ActorConfig

    return ActorConfig(
        strategy="fsdp",  # required by the class; this trainer is neither FSDP nor Megatron
        rollout_n=1,  # required by the class; groups come from the trials' group ids
        ppo_micro_batch_size_per_gpu=1,  # required unless dynamic batching; unused here
        use_torch_compile=False,
        **loss_fields(algorithm, correction, ppo_epochs=options.ppo_epochs),
    )


def algo_config(algorithm: AlgorithmSection) -> Any:
    from verl.trainer.config import AlgoConfig

    return AlgoConfig(
        adv_estimator=algorithm.adv_estimator,
        gamma=algorithm.gamma,
        lam=algorithm.lam,
        norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
    )


def check_names(algorithm: AlgorithmSection) -> None:
    """Fail at construction, by name, on an estimator or loss verl does not register."""
    from verl.trainer.ppo import core_algos

    from slr.errors import ConfigError
    from slr_optimizer_torch.batch import check_estimator

    if algorithm.adv_estimator not in core_algos.ADV_ESTIMATOR_REGISTRY:
        known = ", ".join(sorted(core_algos.ADV_ESTIMATOR_REGISTRY))
        raise ConfigError(
            f"algorithm.adv_estimator = {algorithm.adv_estimator!r} is not a verl advantage "
            f"estimator. Registered: {known}"
        )
    if algorithm.policy_loss not in core_algos.POLICY_LOSS_REGISTRY:
        known = ", ".join(sorted(core_algos.POLICY_LOSS_REGISTRY))
        raise ConfigError(
            f"algorithm.policy_loss = {algorithm.policy_loss!r} is not a verl policy loss. "
            f"Registered: {known}"
        )
    check_estimator(algorithm.adv_estimator)  # registered, but needs inputs we lack?
