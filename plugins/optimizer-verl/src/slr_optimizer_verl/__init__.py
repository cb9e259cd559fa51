"""slr-optimizer-verl: registers the ``verl`` optimizer (verl's FSDP training worker) with slr."""

from slr import hookimpl


@hookimpl
def register_optimizers(register):
    from slr_optimizer_verl.config import VerlOptimizerConfig

    # A string factory: verl and torch load only when a run uses this optimizer.
    register("verl", "slr_optimizer_verl.optimizer:VerlOptimizer", config_cls=VerlOptimizerConfig)
