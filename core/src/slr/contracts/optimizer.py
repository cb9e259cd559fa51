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
        """The current policy weights, for ``Engine.update_weights``."""
        ...

    def save(self, path: Path) -> None:
        """Write a checkpoint (weights, optimizer state, RNG) to ``path``."""
        ...

    def load(self, path: Path) -> None:
        """Restore exactly what ``save`` wrote."""
        ...
