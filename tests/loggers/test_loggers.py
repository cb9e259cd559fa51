"""The metric logger plugins, fed by the run's event hooks as the loop fires them, and read
back with each library's own reader."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from slr import hookimpl
from slr.config import load_config
from slr.errors import UnknownPluginError
from slr.plugins import get_plugin_manager
from slr.run.directory import RunDir

STEPS = [
    {"reward/mean": 0.25, "loss": 1.5, "weights_version": 1, "note": "text is skipped"},
    {"reward/mean": 0.75, "loss": 0.5, "weights_version": 2, "flag": True},
]


def run_with(tmp_path: Path, *loggers: str) -> RunDir:
    """A run directory whose run is fed to ``loggers`` through the event hooks, as
    ``slr.run.loop.train`` fires them."""
    plugins = get_plugin_manager()
    cfg = load_config(
        plugins=plugins,
        choose={"agent": "nop", "backend": "local"},
        sets=[f"run.loggers={json.dumps(list(loggers))}", 'run.name="logged"'],
    )
    run = RunDir.create(tmp_path / "runs", cfg.run.name, cfg.to_toml())
    plugins.emit("on_run_started", run_dir=run, config=cfg)
    for step, metrics in enumerate(STEPS, start=1):
        run.append_metrics(step, metrics)
        plugins.emit("on_step_finished", run_dir=run, step=step, metrics=metrics)
    plugins.emit("on_run_finished", run_dir=run, status="completed")
    return run


@pytest.mark.timeout(60)
def test_tensorboard_event_files_read_back_with_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = run_with(tmp_path, "tensorboard")
    events = EventAccumulator(str(run.path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward/mean", "loss", "weights_version"}
    rewards = [(e.step, e.value) for e in events.Scalars("reward/mean")]
    assert rewards == [(1, 0.25), (2, 0.75)]


def wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a wandb transaction log (``run-<id>.wandb``): a 7-byte header
    (``:W&B``, magic, version), then LevelDB-log framing in 32 KiB blocks (crc32, length,
    type: full / first / middle / last). wandb 0.31 ships no Python reader for it; the
    records are its own protobufs (``wandb.proto.wandb_internal_pb2.Record``)."""
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", "not a wandb transaction log"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # the zero padding of a block's end
            pos += left
            continue
        body, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield body
        elif kind == 2:
            pending = body
        elif kind == 3:
            pending += body
        elif kind == 4:
            yield pending + body


@pytest.mark.timeout(120)
def test_wandb_offline_run_reads_back_with_wandb(tmp_path, monkeypatch):
    from wandb.proto import wandb_internal_pb2

    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the default
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = run_with(tmp_path, "wandb")
    [log] = list((run.path / "wandb").glob("offline-run-*/run-*.wandb"))
    history, config = [], {}
    for data in wandb_records(log):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {i.key or ".".join(i.nested_key): json.loads(i.value_json)
                 for i in record.history.item}
            )  # fmt: skip
        elif kind == "run":  # the run record carries the config given to wandb.init
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    assert [(h["_step"], h["reward/mean"], h["loss"]) for h in history] == [
        (1, 0.25, 1.5),
        (2, 0.75, 0.5),
    ]
    assert "note" not in history[0] and "flag" not in history[1]
    assert config["run"]["name"] == "logged" and config["run"]["loggers"] == ["wandb"]


@pytest.mark.timeout(60)
def test_mlflow_file_store_reads_back_with_mlflow_client(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the run's own file store
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what any reader of it sets
    run = run_with(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=(run.path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("slr")
    assert experiment is not None
    [logged] = client.search_runs([experiment.experiment_id])
    assert logged.info.run_name == run.id and logged.info.status == "FINISHED"
    assert logged.data.tags["slr.run_id"] == run.id
    params = logged.data.params
    assert params["run.name"] == "logged" and params["rollout.temperature"] == "1.0"
    history = client.get_metric_history(logged.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75)]
    assert set(logged.data.metrics) == {"reward/mean", "loss", "weights_version"}


@pytest.mark.timeout(60)
def test_a_resumed_run_goes_on_in_the_same_mlflow_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = run_with(tmp_path, "mlflow")
    plugins = get_plugin_manager()
    cfg = load_config(plugins=plugins, sets=['run.loggers=["mlflow"]', 'run.name="logged"'])
    plugins.emit("on_run_started", run_dir=run, config=cfg)  # as `slr run --resume` does
    plugins.emit("on_step_finished", run_dir=run, step=3, metrics={"reward/mean": 1.0})
    plugins.emit("on_run_finished", run_dir=run, status="interrupted")
    client = MlflowClient(tracking_uri=(run.path / "mlruns").as_uri())
    [logged] = client.search_runs([client.get_experiment_by_name("slr").experiment_id])
    assert logged.info.status == "KILLED"
    history = client.get_metric_history(logged.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75), (3, 1.0)]


def test_mlflow_keys_stay_valid_names():
    from slr_logger_mlflow.logger import flat_params, metric_key

    assert metric_key("reward/mean") == "reward/mean"
    assert metric_key("/a//b:c") == "a/b_c" and metric_key("../x") == "_../x"
    assert dict(flat_params({"run": {"name": "n", "tags": {}}, "x": [1]})) == {
        "run.name": "n",
        "run.tags": "{}",
        "x": "[1]",
    }


def test_an_unknown_logger_fails_at_config_with_what_is_installed():
    with pytest.raises(UnknownPluginError) as err:
        load_config(plugins=get_plugin_manager(), sets=['run.loggers=["tensorbored"]'])
    text = str(err.value)
    assert "Did you mean 'tensorboard'?" in text and "pip install slr-logger-tensorbored" in text


class _Recording:
    def __init__(self):
        self.seen: list = []

    def start(self, run_dir, config):
        self.seen.append(("start", run_dir.id))

    def log_step(self, step, metrics):
        self.seen.append(("step", step, metrics["reward/mean"]))

    def finish(self, status):
        self.seen.append(("finish", status))


class _Exploding(_Recording):
    def log_step(self, step, metrics):
        raise RuntimeError("disk full")


def test_a_failing_logger_does_not_stop_the_others_or_the_run(tmp_path, slr_plugins):
    recording = _Recording()

    class Loggers:
        @hookimpl
        def register_loggers(self, register):
            register("recording", lambda: recording)
            register("exploding", _Exploding)

    slr_plugins.register(Loggers(), name="test-loggers", distribution="slr-test-loggers")
    run = run_with(tmp_path, "exploding", "recording")
    assert recording.seen == [
        ("start", run.id),
        ("step", 1, 0.25),
        ("step", 2, 0.75),
        ("finish", "completed"),
    ]
