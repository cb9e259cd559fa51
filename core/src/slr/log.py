"""structlog, configured once: console on a TTY, JSON lines otherwise.

Modules call ``structlog.get_logger()``; the CLI and servers call ``configure()`` at start.
``run_id`` / ``trial_id`` are bound with ``bind(...)`` (contextvars), so every line inside a
trial's task carries them.

The libraries underneath log through the standard library (transformers, verl, httpx,
uvicorn, ...). ``configure`` sends every such record through the same structlog processors
and stream, tagged with its ``logger`` name, so a run has one log stream in one format.
Libraries that install handlers of their own are taken over by ``capture_stdlib()``, which
``configure`` calls and which the plugin loader calls again after a plugin's module (and
its SDK) is imported: transformers adds its stderr handler at import time.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from structlog.contextvars import bind_contextvars, bound_contextvars, clear_contextvars

__all__ = ["bind", "bound", "capture_stdlib", "clear", "configure"]

# Loggers of libraries known to add handlers of their own, or to log at INFO what a run's
# log does not want (httpx: every request). Their records go through structlog; the level
# is the least a record needs to be shown.
LIBRARY_LEVELS = {
    "transformers": "WARNING",
    "verl": "WARNING",
    "httpx": "WARNING",
    "httpcore": "WARNING",
    "uvicorn": "WARNING",
    "uvicorn.error": "WARNING",
    "uvicorn.access": "WARNING",
}

_configured = False

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
    global _configured
    _configured = True
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _ToStructlog)]
    root.addHandler(_ToStructlog())
    root.setLevel(logging.getLevelNamesMapping()[level.upper()])
    capture_stdlib()


class _ToStructlog(logging.Handler):
    """A standard-library record, logged again through structlog (same stream, same form)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {"logger": record.name}
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            structlog.get_logger().log(record.levelno, record.getMessage(), **fields)
        except Exception:
            self.handleError(record)


def capture_stdlib() -> None:
    """Route the libraries' own loggers to the root logger, hence to structlog.

    Removes the handlers they installed themselves (transformers prints to stderr with its
    own format) and lets their records propagate. Does nothing before ``configure``, so a
    library used without slr's CLI keeps its own logging.
    """
    if not _configured:
        return
    transformers_logging = sys.modules.get("transformers.utils.logging")
    if transformers_logging is not None:
        transformers_logging.disable_default_handler()
        transformers_logging.enable_propagation()
    for name, level in LIBRARY_LEVELS.items():
        lib = logging.getLogger(name)
        lib.handlers[:] = [h for h in lib.handlers if isinstance(h, _ToStructlog)]
        lib.propagate = True
        lib.setLevel(level)
