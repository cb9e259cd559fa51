"""verl's training worker in this process: the process group, the worker, its teardown.

verl's ``TrainingWorker`` (``verl.workers.engine_workers``) is the unit its trainers drive,
one per rank: it builds the FSDP engine (``FSDPEngineWithLMHead``), runs micro-batched
forward/backward with the loss function it is given, and owns the engine's checkpoint
manager. verl's SFT trainer drives it in-process the same way (one per torchrun rank).
This module is that rank for a world of one: it sets the rank environment verl's
``Worker`` reads, starts the ``torch.distributed`` process group itself (verl would ask for
``cpu:gloo,<device>:<backend>``, which torch refuses when both halves are the CPU) and
destroys it on ``close`` if it started it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog
import torch

from slr_optimizer_verl import weights

if TYPE_CHECKING:
    from verl.workers.engine_workers import TrainingWorker

log = structlog.get_logger()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class WorkerGroup:
    """One rank of verl's training worker group, in this process (world size 1)."""

    world_size = 1

    def __init__(self, config: Any, *, loss_fn: Any, device: str) -> None:
        import torch.distributed as dist

        if device == "cpu":
            from slr_optimizer_verl.cpu_platform import select_cpu

            select_cpu()
        self.device = device
        self.owns_group = False
        if not dist.is_initialized():
            port = _free_port()
            os.environ.update(
                RANK="0",
                WORLD_SIZE="1",
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            backend = "gloo" if device == "cpu" else "cpu:gloo,cuda:nccl"
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
            )
            self.owns_group = True
        elif dist.get_world_size() != 1:
            from slr.errors import ConfigError

            raise ConfigError(
                f"this process is already in a torch.distributed group of "
                f"{dist.get_world_size()} ranks; the verl optimizer runs as a world of one here"
            )
        from verl.workers.engine_workers import TrainingWorker

        log.info("optimizer.verl.worker.start", device=device, world_size=1)
        try:
            self._worker: TrainingWorker | None = TrainingWorker(config=config)
            self._worker.set_loss_fn(loss_fn=loss_fn)
            self._worker.reset()  # builds the model, FSDP wrapping, optimizer, lr scheduler
        except BaseException:
            self.close()  # no process group left behind by a worker that never started
            raise

    @property
    def worker(self) -> Any:
        if self._worker is None:
            raise RuntimeError("the verl optimizer was closed; build a new one")
        return self._worker

    @property
    def engine(self) -> Any:
        return self.worker.engine

    def infer(self, data: Any) -> Any:
        return self.worker.infer_batch(data)

    def train(self, data: Any) -> Any:
        return self.worker.train_mini_batch(data)

    def save(self, path: str, step: int) -> None:
        self.worker.save_checkpoint(local_path=path, global_step=step)

    def load(self, path: str) -> None:
        self.worker.load_checkpoint(local_path=path, del_local_after_load=False)

    def weight_buckets(self, max_bytes: int) -> Iterator[weights.Named]:
        """The policy's weights in buckets of at most ``max_bytes``, one gathered at a time."""
        module = self.engine.module
        for names in weights.plan_buckets(weights.sizes(module), max_bytes):
            yield weights.gather(module, names)

    def export_weights(self) -> Mapping[str, torch.Tensor]:
        """The policy's weights as a mapping that gathers each tensor when it is read."""
        module = self.engine.module
        names = [name for name, _ in weights.sizes(module)]
        return weights.GatheredWeights(names, lambda wanted: weights.gather(module, wanted))

    def close(self) -> None:
        import torch.distributed as dist

        self._worker = None
        if getattr(self, "owns_group", False) and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False


def ppo_loss_fn(actor_config: Any) -> Any:
    """verl's own PPO loss (policy loss by name, entropy, KL) bound to its actor config."""
    from verl.workers.utils.losses import ppo_loss

    return partial(ppo_loss, config=actor_config)
