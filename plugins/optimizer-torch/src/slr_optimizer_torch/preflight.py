"""The torch optimizer's preflight: the device it trains on is here, it trains the model
the engine samples from, and routing replay gets the routing it replays."""

from __future__ import annotations

from slr.preflight import CheckResult, Context, fatal, ok, warn
from slr.preflight.gpus import gpu_headroom


def _applies(ctx: Context) -> bool:
    return ctx.purpose == "run" and ctx.uses("optimizer", "torch")


def check_model(ctx: Context) -> CheckResult | None:
    """optimizer.model, when set, is the engine's model: the trainer scores the rollout's
    tokens with its own weights and pushes them back to the engine."""
    if not _applies(ctx):
        return None
    return trains_the_engines_model(ctx)


def trains_the_engines_model(ctx: Context) -> CheckResult:
    """A trainer's ``optimizer.model`` against ``engine.model`` (slr-optimizer-verl's
    preflight asks the same)."""
    trained = ctx.options("optimizer").model
    sampled = getattr(ctx.options("engine"), "model", None)
    if not trained or not sampled or trained == sampled:
        return ok(f"trains the engine's model ({sampled or trained or 'the default'})")
    return warn(
        f"optimizer.model = {trained!r} but engine.model = {sampled!r}: unless they are the "
        f"same weights, the trainer scores and updates a model that did not sample, so "
        f"log-prob agreement is poor from step 1",
        fix="leave optimizer.model empty (it then trains the engine's model)",
        doc="docs/troubleshooting/training.md#log-prob-agreement-falling",
    )


def check_device(ctx: Context) -> CheckResult | None:
    if not _applies(ctx) or ctx.config.run.trainer_resources is not None:
        return None  # a Ray-placed trainer: its GPUs are the gpu / ray-topology checks'
    device = ctx.options("optimizer").device
    if not device.startswith("cuda"):
        return None
    return gpu_headroom(
        f"optimizer.device = {device!r}",
        1,
        fix='set optimizer.device = "cpu" (or "auto": cuda only when there is one)',
    )


def check_routing_replay(ctx: Context) -> CheckResult | None:
    """algorithm.routing_replay needs an engine that records routed experts."""
    if not _applies(ctx) or not ctx.config.algorithm.routing_replay:
        return None
    engine = ctx.options("engine")
    if not hasattr(engine, "return_routed_experts"):
        return warn(
            f"algorithm.routing_replay = true but the {ctx.config.engine.name!r} engine has no "
            f"return_routed_experts option: the trainer replays routing only where a segment "
            f"recorded it",
            fix="use an engine that records routed experts (hf, vllm)",
        )
    if not engine.return_routed_experts:
        return fatal(
            "algorithm.routing_replay = true but engine.return_routed_experts = false: no "
            "routing is recorded, so none can be replayed",
            fix="set engine.return_routed_experts = true (or algorithm.routing_replay = false)",
        )
    return ok("the engine records the routing the trainer replays")
