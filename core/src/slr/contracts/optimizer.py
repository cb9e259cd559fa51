"""The optimizer contract: one policy update from a batch of trials."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from slr.contracts.records import TrialResult


@runtime_checkable
class Optimizer(Protocol):
    def step(self, batch: Sequence[TrialResult]) -> Mapping[str, float]:
        """Update the policy on ``batch`` (trainable trials, grouped); returns step metrics."""
        ...

    def export_weights(self) -> Mapping[str, Any]:
        """The current policy weights, for ``Engine.update_weights``: a state dict, or a
        ``slr.contracts.weights.WeightUpdate`` (e.g. only a LoRA adapter's matrices)."""
        ...

    def save(self, path: Path) -> None:
        """Write a checkpoint (weights, optimizer state, RNG) into the folder ``path``.

        Write only files of your own: the folder's layout around them (its name, the
        ``COMPLETE`` marker written once everything is on disk, the loop's state) belongs
        to ``slr.run.checkpoints``, which calls ``save``.
        """
        ...

    def load(self, path: Path) -> None:
        """Restore exactly what ``save`` wrote (``path`` is a complete checkpoint)."""
        ...

    def servable_weights(self, path: Path) -> Path | None:
        """Where, inside the checkpoint folder ``path`` that ``save`` wrote, lies a model
        folder an engine can serve (e.g. a Hugging Face ``from_pretrained`` folder), or
        None if the checkpoint has none. Recorded in the checkpoint, so ``slr eval
        --checkpoint`` serves it without building the optimizer."""
        ...


@runtime_checkable
class ClosableOptimizer(Protocol):
    """An optimizer that holds something to let go of when the run ends (optional): worker
    processes, a Ray actor (``slr.cluster.trainer.RemoteOptimizer``). The loop calls
    ``close`` once, after the last step, on every path."""

    def close(self) -> None: ...
