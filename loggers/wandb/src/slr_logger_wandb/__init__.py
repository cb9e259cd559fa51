"""slr-logger-wandb: each step's metrics and the config to Weights & Biases (offline by default)."""

from __future__ import annotations

import slr


@slr.hookimpl
def register_loggers(register):
    register("wandb", "slr_logger_wandb.logger:WandbLogger")
