"""Event files written with tensorboard's own writer and protos (no torch, no TensorFlow)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from slr.metrics.loggers import scalars

#: The folder inside the run directory that holds the event files.
FOLDER = "tensorboard"


class TensorBoardLogger:
    """``slr.metrics.loggers.MetricLogger`` writing one scalar per metric and step."""

    def __init__(self) -> None:
        self.writer: Any = None

    def start(self, run_dir: Any, config: Any) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        # A resumed run adds a new event file beside the old one; TensorBoard merges them.
        self.writer = EventFileWriter(str(run_dir.path / FOLDER), flush_secs=5)

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        # Generated protobuf modules: their classes are made at import, unseen by pyright.
        summary_cls: Any = summary_pb2.Summary  # pyright: ignore[reportAttributeAccessIssue]
        event_cls: Any = event_pb2.Event  # pyright: ignore[reportAttributeAccessIssue]
        values = [
            summary_cls.Value(tag=tag, simple_value=value)
            for tag, value in scalars(metrics).items()
        ]
        event = event_cls(wall_time=time.time(), step=step, summary=summary_cls(value=values))
        self.writer.add_event(event)
        self.writer.flush()  # a step is minutes of compute: never lose its line

    def finish(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
