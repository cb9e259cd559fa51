"""The verl optimizer's preflight: it trains the model the engine samples from, what it
cannot do is refused by name (routing replay, options it runs at world size 1 only), and its
device and ranks have somewhere to run, before anything starts. verl and torch are not
imported: the config checks are instant.
"""

from __future__ import annotations

from slr_optimizer_torch.preflight import trains_the_engines_model

from slr.preflight import CheckResult, Context, fatal, ok
from slr.preflight.gpus import gpu_headroom, visible_gpus
from slr_optimizer_verl import refusals

DOC = "docs/troubleshooting/training.md#a-setting-is-refused-before-the-run-starts"


def _applies(ctx: Context) -> bool:
    return ctx.purpose == "run" and ctx.uses("optimizer", "verl")


def _fatal(refusal: refusals.Refusal) -> CheckResult:
    problem, fix = refusal
    return fatal(problem, fix=fix, doc=DOC)


def _remote(ctx: Context) -> bool:
    return ctx.config.run.ray_address not in (None, "local")


def check_model(ctx: Context) -> CheckResult | None:
    """A model to train, and the one the engine samples from."""
    if not _applies(ctx):
        return None
    sampled = getattr(ctx.options("engine"), "model", None)
    if not ctx.options("optimizer").model and not sampled:
        return fatal(
            "the verl optimizer has no model to train: optimizer.model is empty and the "
            f"{ctx.config.engine.name!r} engine names none",
            fix="set [optimizer] model (a Hugging Face model folder), or [engine] model",
        )
    return trains_the_engines_model(ctx)


def check_routing_replay(ctx: Context) -> CheckResult | None:
    if not _applies(ctx) or not ctx.config.algorithm.routing_replay:
        return None
    refusal = refusals.routing_replay(ctx.config.algorithm)
    return _fatal(refusal) if refusal else None


def check_world_size(ctx: Context) -> CheckResult | None:
    """Options this optimizer runs at world size 1 only, refused at world size >= 2."""
    if not _applies(ctx):
        return None
    options = ctx.options("optimizer")
    refusal = refusals.multi_rank(ctx.config.algorithm, options)
    if refusal is not None:
        return _fatal(refusal)
    if options.world_size == 1:
        return None
    return ok(f"optimizer.world_size = {options.world_size}: the actor over every rank")


def _device(ctx: Context) -> str:
    """What ``worker.resolve_device`` will pick, judged from nvidia-smi (no torch here)."""
    device = ctx.options("optimizer").device
    if device == "auto":
        return "cuda" if visible_gpus() else "cpu"
    return device


def check_device(ctx: Context) -> CheckResult | None:
    """cuda (asked, or what auto picks here) has its GPUs on this machine: one for world
    size 1, one per rank for the ranks of a local Ray."""
    if not _applies(ctx) or ctx.config.run.trainer_resources is not None:
        return None  # a Ray-placed trainer: its GPUs are the gpu / ray-topology checks'
    options = ctx.options("optimizer")
    if _device(ctx) != "cuda" or (options.world_size > 1 and _remote(ctx)):
        return None  # cpu; or a cluster's ranks, which are verl-ranks'
    return gpu_headroom(
        f"optimizer.device = {options.device!r} with optimizer.world_size = {options.world_size}",
        options.world_size,
        fix='set optimizer.device = "cpu" (or "auto": cuda only when there is one)'
        + (", or lower optimizer.world_size" if options.world_size > 1 else ""),
    )


def check_ranks(ctx: Context) -> CheckResult | None:
    """The ranks fit on one node of the cluster at ``run.ray_address`` (a local Ray is
    started with a CPU per rank, and its GPUs are verl-device's)."""
    if not _applies(ctx):
        return None
    options = ctx.options("optimizer")
    if options.world_size == 1 or not _remote(ctx):
        return None
    from slr.cluster.ray_runtime import cluster_nodes

    address = str(ctx.config.run.ray_address)
    try:
        nodes = cluster_nodes(address)
    except Exception as exc:
        return fatal(
            f"the Ray cluster at run.ray_address = {address!r}, where the verl optimizer's "
            f"{options.world_size} ranks run, does not answer ({exc})",
            fix="start it (`ray start --head`), or fix run.ray_address",
        )
    refusal = refusals.unplaceable(nodes, options.world_size, _device(ctx))
    if refusal is not None:
        return _fatal(refusal)
    return ok(f"a node of the Ray cluster at {address} holds all {options.world_size} ranks")
