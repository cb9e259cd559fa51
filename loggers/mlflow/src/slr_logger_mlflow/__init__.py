"""slr-logger-mlflow: each step's metrics and the config to an MLflow tracking store (a local
file store under RUN/mlruns/ by default)."""

from __future__ import annotations

import slr


@slr.hookimpl
def register_loggers(register):
    register("mlflow", "slr_logger_mlflow.logger:MlflowLogger")
