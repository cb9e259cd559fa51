"""``make_group``: the verl worker group an optimizer (or another of verl's roles) runs on.

World size 1 is verl's ``TrainingWorker`` in this process (``worker.WorkerGroup``); world
size N >= 2 is N Ray actors under verl's single controller (``ray_group.RayGroup``). Both
offer the same surface, so a role built on one runs on the other: ``infer(td)``,
``train(td)`` (verl's no-padding ``TensorDict`` in, verl's output out, rows in the
caller's order), ``save(path, step)`` / ``load(path)`` through verl's checkpoint manager on
every rank, ``weight_buckets(max_bytes)`` / ``export_weights()`` (one parameter gathered at
a time), ``world_size`` and ``close()``.
"""

from __future__ import annotations

from typing import Any


def make_group(
    config: Any,
    *,
    loss_fn: Any,
    device: str,
    world_size: int = 1,
    ray_address: str | None = None,
) -> Any:
    """verl's worker group for ``config`` (a ``TrainingWorkerConfig``) over ``world_size``
    ranks; ``ray_address`` is the run's Ray (``[run] ray_address``) for world size >= 2."""
    if world_size == 1:
        from slr_optimizer_verl.worker import WorkerGroup

        return WorkerGroup(config, loss_fn=loss_fn, device=device)
    from slr_optimizer_verl.ray_group import RayGroup

    return RayGroup(
        config, loss_fn=loss_fn, device=device, world_size=world_size, ray_address=ray_address
    )
