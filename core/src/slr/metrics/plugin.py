"""Feeds the loggers named in ``[run] loggers`` from the run's event hooks.

The loop knows no logger: it fires ``on_run_started`` / ``on_step_finished`` /
``on_run_finished`` as it always does, and this plugin builds each run's loggers from the
``logger`` registry and forwards. One logger failing is logged and the others still get the
event (the run is never stopped by a logger).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from slr.hookspecs import hookimpl

log = structlog.get_logger()

_active: dict[Path, list[Any]] = {}


def _each(run_dir: Any, what: str, call) -> None:
    for logger in _active.get(Path(run_dir.path), []):
        try:
            call(logger)
        except Exception:
            log.exception("metric logger failed", metric_logger=type(logger).__name__, hook=what)


@hookimpl
def on_run_started(run_dir, config):
    from slr.plugins import get_plugin_manager

    names = getattr(getattr(config, "run", None), "loggers", ())  # a run config, or no loggers
    if not names:
        return
    plugins = get_plugin_manager()
    loggers = []
    for name in names:
        try:
            logger = plugins.get("logger", name).create(config=config)
            logger.start(run_dir, config)
        except Exception:
            log.exception(
                "metric logger could not start; the run goes on without it", metric_logger=name
            )
            continue
        loggers.append(logger)
    _active[Path(run_dir.path)] = loggers


@hookimpl
def on_step_finished(run_dir, step: int, metrics: Mapping[str, Any]):
    _each(run_dir, "step", lambda logger: logger.log_step(step, metrics))


@hookimpl
def on_run_finished(run_dir, status: str):
    _each(run_dir, "finish", lambda logger: logger.finish(status))
    _active.pop(Path(run_dir.path), None)
