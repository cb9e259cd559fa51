"""slr-logger-tensorboard: each step's metrics as TensorBoard scalars under RUN/tensorboard/."""

from __future__ import annotations

import slr


@slr.hookimpl
def register_loggers(register):
    register("tensorboard", "slr_logger_tensorboard.logger:TensorBoardLogger")
