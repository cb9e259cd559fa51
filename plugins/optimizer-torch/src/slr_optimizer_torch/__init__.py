"""slr-optimizer-torch: registers the embedded ``torch`` optimizer with slr."""

from slr import hookimpl


@hookimpl
def register_optimizers(register):
    from slr_optimizer_torch.config import TorchOptimizerConfig

    # A string factory: torch, transformers and verl load only when a run uses this optimizer.
    register(
        "torch", "slr_optimizer_torch.optimizer:TorchOptimizer", config_cls=TorchOptimizerConfig
    )


@hookimpl
def register_preflight_checks(register):
    from slr_optimizer_torch.preflight import check_device, check_model, check_routing_replay

    register("torch-model", check_model, stage="config")
    register("torch-routing-replay", check_routing_replay, stage="config")
    register("torch-device", check_device, stage="machine")
