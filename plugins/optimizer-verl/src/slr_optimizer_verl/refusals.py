"""What the verl optimizer refuses, as (problem, fix) pairs: the preflight shows them as
fatal lines before anything starts, and the optimizer raises them when it is built
(``--skip-preflight``, or built outside a run). Nothing here imports verl or torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slr.config import AlgorithmSection
from slr_optimizer_verl.config import VerlOptimizerConfig

Refusal = tuple[str, str]
"""(what is wrong, with the values; what to do)"""


def routing_replay(algorithm: AlgorithmSection) -> Refusal | None:
    """verl replays MoE routing (``router_replay``) in its megatron and veomni engines only;
    this optimizer runs verl's FSDP engine, whose ``TrainingWorker`` never reads it."""
    if not algorithm.routing_replay:
        return None
    return (
        "algorithm.routing_replay = true but the verl optimizer cannot replay routing: verl "
        "replays it only in its megatron and veomni engines, not the FSDP engine this "
        "optimizer runs, so its forward passes would route tokens their own way",
        'set [optimizer] name = "torch" (it replays the engine\'s recorded routing), or '
        "algorithm.routing_replay = false",
    )


def multi_rank(algorithm: AlgorithmSection, options: VerlOptimizerConfig) -> Refusal | None:
    """What runs at world size 1 only so far, refused by name at world size >= 2."""
    if options.world_size == 1:
        return None
    wanted = [
        name
        for name, on in (
            ("algorithm.adv_estimator = 'gae' (the critic)", algorithm.adv_estimator == "gae"),
            ("algorithm.use_kl_loss (the reference)", algorithm.use_kl_loss),
            ("optimizer.lora_rank > 0", options.lora_rank > 0),
            ("optimizer.use_fused_kernels", options.use_fused_kernels),
            ("[algorithm.rollout_correction]", algorithm.rollout_correction.configured),
        )
        if on
    ]
    if not wanted:
        return None
    return (
        f"optimizer.world_size = {options.world_size} with {', '.join(wanted)}: the verl "
        f"optimizer spreads only the actor over ranks so far",
        "set world_size = 1 for these, or turn them off",
    )


def rank_ask(world_size: int, device: str) -> dict[str, float]:
    """What each node must hold for the ranks: they are packed on one node (``ray_group``),
    ``{CPU: 1}`` each, plus ``{GPU: 1}`` on cuda."""
    return {"CPU": float(world_size), **({"GPU": float(world_size)} if device == "cuda" else {})}


def unplaceable(
    nodes: Sequence[Mapping[str, float]], world_size: int, device: str
) -> Refusal | None:
    """No node of ``nodes`` (Ray's resources per live node) holds every rank: Ray would
    wait forever for the placement group."""
    need = rank_ask(world_size, device)
    if any(all(float(n.get(k, 0)) >= v for k, v in need.items()) for n in nodes):
        return None
    have = (
        "; ".join(", ".join(f"{k} {float(n.get(k, 0)):g}" for k in need) for n in nodes)
        or "no nodes"
    )
    return (
        f"optimizer.world_size = {world_size} puts its ranks on one Ray node asking "
        f"{', '.join(f'{k} = {v:g}' for k, v in need.items())}, but the nodes have: {have}",
        "lower optimizer.world_size or add a node with room for every rank",
    )
