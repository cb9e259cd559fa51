"""Metric loggers: the contract a logger plugin implements, and what it is handed.

A logger is registered by a plugin (``register_loggers``) and chosen per run with
``[run] loggers = ["tensorboard", ...]``. The core's built-in plugin
``slr.metrics.plugin`` builds the chosen loggers when a run starts and feeds
them from the run's event hooks, so a logger sees exactly what ``metrics.jsonl`` holds, and
a failing logger is logged and skipped like any event hook: it never stops a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from slr.config import Config
    from slr.run.directory import RunDir


@runtime_checkable
class MetricLogger(Protocol):
    """One run's metric sink (TensorBoard, wandb, ...). Built once per run by its factory
    (called with no argument, or ``from_config(config)`` when it defines one)."""

    def start(self, run_dir: RunDir, config: Config) -> None:
        """The run started (fresh or resumed); write under ``run_dir.path`` if on disk."""
        ...

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Step ``step``'s metrics, the line just appended to ``metrics.jsonl``."""
        ...

    def finish(self, status: str) -> None:
        """The run ended (``completed``, ``failed``, ``interrupted``); flush and close."""
        ...


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers in a metrics line (booleans and text left out), as floats."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out
