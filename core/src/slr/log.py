"""structlog, configured once: console on a TTY, JSON lines otherwise.

Modules call ``structlog.get_logger()``; the CLI and servers call ``configure()`` at start.
``run_id`` / ``trial_id`` are bound with ``bind(...)`` (contextvars), so every line inside a
trial's task carries them.
"""

from __future__ import annotations

import logging
import sys

import structlog
from structlog.contextvars import bind_contextvars, bound_contextvars, clear_contextvars

__all__ = ["bind", "bound", "clear", "configure"]

bind = bind_contextvars
bound = bound_contextvars
clear = clear_contextvars


def configure(*, level: str = "info", json: bool | None = None, stream=None) -> None:
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    renderer = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
