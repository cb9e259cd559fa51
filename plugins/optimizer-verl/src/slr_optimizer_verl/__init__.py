"""slr-optimizer-verl: registers the ``verl`` optimizer (verl's FSDP training worker) with slr."""

from slr import hookimpl


@hookimpl
def register_optimizers(register):
    from slr_optimizer_verl.config import VerlOptimizerConfig

    # A string factory: verl and torch load only when a run uses this optimizer.
    register("verl", "slr_optimizer_verl.optimizer:VerlOptimizer", config_cls=VerlOptimizerConfig)


@hookimpl
def register_preflight_checks(register):
    from slr_optimizer_verl import preflight

    register("verl-model", preflight.check_model, stage="config")
    register("verl-routing-replay", preflight.check_routing_replay, stage="config")
    register("verl-world-size", preflight.check_world_size, stage="config")
    register("verl-device", preflight.check_device, stage="machine")
    register("verl-ranks", preflight.check_ranks, stage="machine")
