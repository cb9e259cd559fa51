"""Off-policy correction with verl's rollout-correction helpers, selected by verl's names.

The behaviour log-probs are the rollout's (per token, possibly from several weight
versions); the trainer's are its own, recomputed before the update (pi_old). verl calls the
gap "rollout correction" and ships the whole of it in ``verl.trainer.ppo.rollout_corr_helper``:
importance-sampling weights (token or sequence level, truncated or IcePop-banded), rejection
masks (token / sequence divergence bounds) and the bypass mode (the rollout's log-probs are
the PPO ratio's denominator). This module only resolves ``[algorithm.rollout_correction]``
into verl's ``RolloutCorrectionConfig`` (a preset by its method name, then verl's field
names on top), checks it once, and calls verl's functions the way verl's trainer does:

- decoupled mode (``bypass_mode = false``, verl's ``ray_trainer``): once per batch, from
  pi_old vs the rollout, ``compute_rollout_correction_and_rejection_mask`` gives the IS
  weights (handed to the policy loss as ``rollout_is_weights``) and the response mask with
  rejected tokens removed (the loss, and its normalisation, use it);
- bypass mode (``apply_bypass_mode``): the old log-probs are the rollout's and the policy
  loss is verl's registered ``bypass_mode`` loss, which computes the weights and masks
  itself, per micro-batch, from the current policy (verl's actor does the same).

A section that sets nothing leaves the trainer exactly as it was (``resolve`` returns None).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import attrs
import torch

from slr.config import AlgorithmSection
from slr.errors import ConfigError

#: verl's spelling of "no IS weights" / "no rejection" in TOML, which has no null.
NONE = "none"
LOSS_TYPES = ("ppo_clip", "reinforce")
IS_LEVELS = ("token", "sequence")


class _Options(Protocol):
    """What ``resolve`` reads of an optimizer's options (the torch and verl optimizers')."""

    @property
    def old_logprobs(self) -> str: ...


def presets() -> list[str]:
    """verl's named presets: the classmethods of ``RolloutCorrectionConfig``."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    return sorted(
        name
        for name, member in vars(RolloutCorrectionConfig).items()
        if isinstance(member, classmethod) and not name.startswith("_")
    )


@attrs.frozen
class Correction:
    """A resolved, checked verl ``RolloutCorrectionConfig`` and how the trainer applies it."""

    config: Any  # verl.trainer.config.algorithm.RolloutCorrectionConfig

    @property
    def bypass(self) -> bool:
        return bool(self.config.bypass_mode)

    @property
    def decoupled(self) -> bool:
        """Decoupled mode with something to apply (IS weights or rejection) before the loss."""
        return not self.bypass and (
            self.config.rollout_is is not None or self.config.rollout_rs is not None
        )

    def apply(
        self, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
        """Decoupled mode: (IS weights or None, the mask minus rejected tokens, metrics)."""
        from verl.trainer.ppo.rollout_corr_helper import (
            compute_rollout_correction_and_rejection_mask,
        )

        c = self.config
        proto, kept, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=old_logprobs,
            rollout_log_prob=rollout_logprobs,
            response_mask=mask,
            rollout_is=c.rollout_is,
            rollout_is_threshold=c.rollout_is_threshold,
            rollout_is_batch_normalize=c.rollout_is_batch_normalize,
            rollout_rs=c.rollout_rs,
            rollout_rs_threshold=c.rollout_rs_threshold,
        )
        weights = proto.batch["rollout_is_weights"] if proto is not None else None
        return weights, kept.to(mask.dtype), {k: float(v) for k, v in metrics.items()}


def offpolicy_metrics(
    trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """verl's rollout-vs-trainer diagnostics (``rollout_corr/kl``, ``k3_kl``, ``chi2_*``, ...)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_corr_metrics_from_logprobs

    if not bool((mask > 0).any()):
        return {}
    metrics = compute_rollout_corr_metrics_from_logprobs(
        log_prob=trainer_logprobs, rollout_log_prob=rollout_logprobs, response_mask=mask
    )
    return {k: float(v) for k, v in metrics.items()}


def _none(value: Any) -> Any:
    return None if isinstance(value, str) and value.strip().lower() == NONE else value


def resolve(algorithm: AlgorithmSection, options: _Options | None = None) -> Correction | None:
    """``[algorithm.rollout_correction]`` as verl's config, checked; None when nothing is set.

    Every error names the key, the value and what verl allows.
    """
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import rollout_corr_helper as helper

    section = algorithm.rollout_correction
    if not section.configured:
        return None
    where = "algorithm.rollout_correction"
    base = RolloutCorrectionConfig.disabled()
    if section.preset:
        known = presets()
        if section.preset not in known:
            raise ConfigError(
                f"{where}.preset = {section.preset!r} is not a verl RolloutCorrectionConfig "
                f"preset. Presets: {', '.join(known)}"
            )
        base = getattr(RolloutCorrectionConfig, section.preset)()
    overrides = {k: _none(v) for k, v in section.overrides().items()}
    config = dataclasses.replace(base, **overrides)

    if config.rollout_is is not None and config.rollout_is not in IS_LEVELS:
        raise ConfigError(
            f"{where}.rollout_is = {config.rollout_is!r} is not a verl IS level. "
            f"Allowed: {', '.join(IS_LEVELS)}, {NONE}"
        )
    if config.loss_type not in LOSS_TYPES:
        raise ConfigError(
            f"{where}.loss_type = {config.loss_type!r} is not a verl bypass loss type. "
            f"Allowed: {', '.join(LOSS_TYPES)}"
        )
    if config.rollout_is is not None:
        try:
            helper._parse_rollout_is_threshold(config.rollout_is_threshold)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{where}.rollout_is_threshold = {config.rollout_is_threshold!r} is not valid: "
                f"{exc} Write a number (e.g. 2.0) or 'lower_upper' (e.g. '0.5_5.0')"
            ) from None
    if config.rollout_rs is not None:
        names = [n.strip() for n in str(config.rollout_rs).split(",") if n.strip()]
        unknown = [n for n in names if n not in helper.SUPPORTED_ROLLOUT_RS_OPTIONS]
        if unknown or not names:
            raise ConfigError(
                f"{where}.rollout_rs = {config.rollout_rs!r}: {', '.join(unknown) or 'empty'} "
                f"is not a verl rejection option. Allowed (comma-separated): "
                f"{', '.join(sorted(helper.SUPPORTED_ROLLOUT_RS_OPTIONS))}, or {NONE}"
            )
        if config.rollout_rs_threshold is None:
            raise ConfigError(
                f"{where}.rollout_rs = {config.rollout_rs!r} needs rollout_rs_threshold: "
                f"'lower_upper' ratios for *_k1 options (e.g. '0.5_2.0'), an upper bound for "
                f"k2 / k3 (e.g. 0.01)"
            )
        try:
            helper._parse_rollout_rs_thresholds(
                list(dict.fromkeys(names)), config.rollout_rs_threshold
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{where}.rollout_rs_threshold = {config.rollout_rs_threshold!r} is not valid "
                f"for rollout_rs = {config.rollout_rs!r}: {exc}"
            ) from None
    if config.bypass_mode and algorithm.policy_loss != "vanilla":
        raise ConfigError(
            f"{where}.bypass_mode = true replaces the policy loss with verl's bypass_mode loss "
            f"(loss_type ppo_clip or reinforce), so algorithm.policy_loss = "
            f"{algorithm.policy_loss!r} would be ignored; set policy_loss = 'vanilla' or "
            f"bypass_mode = false"
        )
    correction = Correction(config)
    if correction.decoupled and options is not None and options.old_logprobs == "rollout":
        raise ConfigError(
            f"{where} in decoupled mode weighs the rollout against the trainer's recomputed "
            f"log-probs, but optimizer.old_logprobs = 'rollout'; set old_logprobs = "
            f"'recompute', or {where}.bypass_mode = true to use the rollout's log-probs"
        )
    return correction


def policy_loss_config(correction: Correction | None, loss_mode: str) -> Any:
    """verl's ``PolicyLossConfig``: bypass mode selects verl's ``bypass_mode`` loss and hands
    it the correction (what ``apply_bypass_mode`` does to verl's actor config)."""
    from verl.workers.config.actor import PolicyLossConfig

    if correction is not None and correction.bypass:
        return PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=correction.config)
    return PolicyLossConfig(loss_mode=loss_mode)
