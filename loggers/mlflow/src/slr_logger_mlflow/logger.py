"""An MLflow run per slr run, in a local file store under the run directory by default.

The file store needs no server and no network: the metrics of a training machine with no
route out land in ``RUN/mlruns/`` and any MLflow client reads them there. MLflow keeps that
store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is true, so this
logger opts in for ``file:`` stores (a value the user set is left as it is).
``MLFLOW_TRACKING_URI`` points the logger at another store (a tracking server, a database),
``MLFLOW_EXPERIMENT_NAME`` names the experiment (default ``slr``).

It uses an ``MlflowClient`` of its own, never MLflow's global active run, so nothing else in
the process that uses MLflow is disturbed.
"""

from __future__ import annotations

import os
import posixpath
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

import structlog

from slr.metrics.loggers import scalars

log = structlog.get_logger()

#: The folder inside the run directory that holds the default file store.
FOLDER = "mlruns"
DEFAULT_EXPERIMENT = "slr"
#: The run tag that ties an MLflow run to its slr run, so a resumed run logs into the same one.
RUN_TAG = "slr.run_id"
#: MLflow's own limits: parameters and metrics per log_batch call, a parameter value's length.
PARAMS_PER_BATCH, METRICS_PER_BATCH, PARAM_VALUE_MAX = 100, 1000, 6000
#: slr's termination of a run -> MLflow's run status.
STATUS = {"completed": "FINISHED", "interrupted": "KILLED"}


def tracking_uri(run_path: Any) -> str:
    """``MLFLOW_TRACKING_URI`` when set, else a file store in ``RUN/mlruns/``."""
    from pathlib import Path

    return os.environ.get("MLFLOW_TRACKING_URI") or (Path(run_path) / FOLDER).resolve().as_uri()


def metric_key(name: str) -> str:
    """``name`` as an MLflow key: letters, digits, ``_ - . /`` and spaces only, and a path
    that does not resolve to another name (the file store makes it one)."""
    key = re.sub(r"[^\w./ -]", "_", name)
    key = posixpath.normpath(key).lstrip("/")
    return key if key not in ("", ".") and not key.startswith("..") else "_" + key


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """The config as dotted parameter names and text values (``rollout.temperature``)."""
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, f"{name}.")
        else:
            yield metric_key(name), str(value)[:PARAM_VALUE_MAX]


class MlflowLogger:
    """``slr.metrics.loggers.MetricLogger`` over ``MlflowClient``: params once, metrics per step."""

    def __init__(self) -> None:
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, run_dir: Any, config: Any) -> None:
        from mlflow.tracking import MlflowClient

        uri = tracking_uri(run_dir.path)
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT)
        experiment = client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment is not None else client.create_experiment(name)
        )
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_dir.id}'", max_results=1
        )
        if found:  # a resumed slr run goes on in the MLflow run it started
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
            logged = found[0].data.params
        else:
            run = client.create_run(experiment_id, run_name=run_dir.id, tags={RUN_TAG: run_dir.id})
            self.run_id = run.info.run_id
            logged = {}
        self.client = client
        self._log_params(dict(flat_params(config.to_dict())), logged)

    def _log_params(self, params: dict[str, str], logged: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        # MLflow parameters cannot change; a resumed run with a changed option keeps the first.
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
        if changed:
            log.warning(
                "mlflow keeps the first value of a parameter; not logging the changed ones",
                params=changed,
            )
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for i in range(0, len(new), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[i : i + PARAMS_PER_BATCH])

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(metric_key(key), value, now, step) for key, value in scalars(metrics).items()
        ]
        for i in range(0, len(batch), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i : i + METRICS_PER_BATCH])

    def finish(self, status: str) -> None:
        if self.client is None or self.run_id is None:
            return
        self.client.set_terminated(self.run_id, status=STATUS.get(status, "FAILED"))
        self.client = self.run_id = None
