"""One rank of the verl optimizer's Ray worker group: verl's ``TrainingWorker`` as an actor.

verl's ``RayWorkerGroup`` starts one actor per rank with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` in its environment; ``TrainingWorker`` then joins the
``torch.distributed`` group and builds its FSDP engine over all ranks. ``RankWorker`` is
that worker with what this plugin adds, through verl's own extension points:

- on the CPU, verl's platform ``cpu`` (``cpu_platform``, selected by the environment the
  group passes) and a ``gloo`` process group started before verl asks for
  ``cpu:gloo,cpu:gloo``, which torch refuses; on a loopback master, gloo is kept on ``lo``;
- the weights read out one bucket at a time (``weight_sizes``, ``gather_weights``: every
  rank joins each gather, rank 0 returns the tensors), registered with verl's
  ``ONE_TO_ALL`` dispatch like the worker's own ``save_checkpoint``;
- ``describe``: the rank's process id and node, for the driver's errors and tests.

This module imports verl's workers at its top, after the CPU platform is registered: Ray
imports it in each rank's process to rebuild the class.
"""

from __future__ import annotations

import os
from typing import Any

# first: registers verl's "cpu" platform before verl's workers ask for the platform
from slr_optimizer_verl import cpu_platform, weights

# isort: split
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import TrainingWorker

LOOPBACK = "127.0.0.1"
#: verl's "same call on every rank" dispatch (a member verl registers at import)
ONE_TO_ALL: Any = Dispatch.ONE_TO_ALL  # pyright: ignore[reportAttributeAccessIssue]


def start_gloo() -> None:
    """Join the group verl's worker group describes in the environment, with ``gloo``."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    if addr == LOOPBACK:
        # gloo binds the interface the host name resolves to unless told; stay on loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


class RankWorker(TrainingWorker):
    """verl's ``TrainingWorker`` on one rank, on the CPU (gloo) or a GPU (verl's own nccl)."""

    def __init__(self, config: Any, device: str = "cpu") -> None:
        if device == "cpu":
            cpu_platform.select_cpu()
            start_gloo()
        super().__init__(config)

    def _module(self) -> Any:
        engine: Any = self.engine  # verl's FSDP engine: its wrapped module
        return engine.module

    @register(dispatch_mode=ONE_TO_ALL)
    def describe(self) -> dict[str, Any]:
        import ray

        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    @register(dispatch_mode=ONE_TO_ALL)
    def weight_sizes(self) -> list[tuple[str, int]]:
        return weights.sizes(self._module())

    @register(dispatch_mode=ONE_TO_ALL)
    def gather_weights(self, names: list[str]) -> weights.Named | None:
        gathered = weights.gather(self._module(), names)  # a collective: every rank joins
        return gathered if self.rank == 0 else None
