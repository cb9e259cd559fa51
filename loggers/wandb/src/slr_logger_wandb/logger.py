"""A wandb run per slr run, offline unless ``WANDB_MODE`` says otherwise.

Offline is the default because a training machine often has no route out, and a logger
must never stall or fail a run: the files land in ``RUN/wandb/`` and ``wandb sync`` uploads
them from anywhere later.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from slr.metrics.loggers import scalars

DEFAULT_PROJECT = "slr"


def run_key(run_id: str) -> str:
    """A wandb run id for an slr run id: the same run resumed logs into the same wandb run."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", run_id)[:64]


class WandbLogger:
    """``slr.metrics.loggers.MetricLogger`` over ``wandb.init`` / ``log`` / ``finish``."""

    def __init__(self) -> None:
        self.run: Any = None

    def start(self, run_dir: Any, config: Any) -> None:
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
            name=run_dir.id,
            id=run_key(run_dir.id),
            dir=str(run_dir.path),
            mode=os.environ.get("WANDB_MODE", "offline"),  # pyright: ignore[reportArgumentType]
            config=config.to_dict(),
            resume="allow",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def finish(self, status: str) -> None:
        if self.run is None:
            return
        import wandb

        self.run.finish(exit_code=0 if status == "completed" else 1)
        self.run = None
        # finish() returns once the run is closed, not once wandb's service has written it
        # out; ending the service makes the run's files complete when the run ends.
        wandb.teardown()
