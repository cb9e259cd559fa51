"""The ``[algorithm]`` names the trainers on verl's functions accept, as data.

Both first-party optimizers (``torch`` and slr-optimizer-verl's ``verl``) run verl's
advantage estimators and policy losses by name (``verl_config.check_names``) and verl's KL
estimators (``kl_penalty``). Reading verl's registries means importing verl and torch, tens of
seconds, so the names are listed here and a config is checked against them when it is
loaded (``TrainerOptions.ACCEPTS``), before anything starts; a test keeps each list equal to
what the installed verl registers and this trainer can feed.
"""

from __future__ import annotations

#: verl's ``ADV_ESTIMATOR_REGISTRY``, less the estimators that need inputs these trainers
#: do not produce (``batch.check_estimator``: remax's reward baselines, the optimal-token
#: baselines' sum of squared probabilities).
ADV_ESTIMATORS: tuple[str, ...] = (
    "gae",
    "gdpo",
    "gpg",
    "grpo",
    "grpo_passk",
    "grpo_vectorized",
    "opo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "rloo",
    "rloo_vectorized",
)

#: verl's ``POLICY_LOSS_REGISTRY``.
POLICY_LOSSES: tuple[str, ...] = (
    "bypass_mode",
    "cispo",
    "clip_cov",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "geo_mean",
    "gpg",
    "gspo",
    "kl_cov",
    "sapo",
    "vanilla",
)

_KL = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
#: what verl's ``kl_penalty`` computes (a ``+`` suffix: the k2 gradient, straight through);
#: ``full`` is a name verl knows but does not implement.
KL_LOSS_TYPES: tuple[str, ...] = _KL + tuple(f"{name}+" for name in _KL)

#: ``[algorithm]`` key -> the names accepted for it (``TrainerOptions.ACCEPTS``).
ACCEPTS: dict[str, tuple[str, ...]] = {
    "adv_estimator": ADV_ESTIMATORS,
    "policy_loss": POLICY_LOSSES,
    "kl_loss_type": KL_LOSS_TYPES,
}
