"""One verl worker group per role of verl's PPO trainer: the actor, the reference, the critic.

verl's trainer (``RayPPOTrainer.init_workers``) runs each role as its own ``TrainingWorker``
with its own config: the actor (policy, trained with ``ppo_loss``), the reference (the
initial policy, forward passes only, for the KL loss) and the critic (a value model trained
with ``value_loss``). ``build_group`` is the one place a role's group is made, so every role
is placed the same way.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from slr_optimizer_verl.group import make_group

Role = Literal["actor", "ref", "critic"]


def build_group(
    role: Role,
    config: Any,
    *,
    loss_fn: Any,
    device: str,
    world_size: int = 1,
    ray_address: str | None = None,
) -> Any:
    """The worker group for ``role`` from its verl ``TrainingWorkerConfig``: verl's worker in
    this process at world size 1, ``world_size`` Ray actors otherwise (``group.make_group``;
    the optimizer refuses the reference and critic at world size >= 2 so far)."""
    if role == "critic" and device == "cpu":
        # verl's value-model loader asks for flash-attn; the CPU platform's own engine does not
        from slr_optimizer_verl import cpu_value_engine  # noqa: F401 - registers the engine
    return make_group(
        config, loss_fn=loss_fn, device=device, world_size=world_size, ray_address=ray_address
    )


def value_loss_fn(critic_config: Any) -> Any:
    """verl's own value loss (clipped, aggregated as configured) bound to its critic config."""
    from verl.workers.utils.losses import value_loss

    return partial(value_loss, config=critic_config)
