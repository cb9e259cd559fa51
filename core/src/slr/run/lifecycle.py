"""One run's life, written once for every command that makes a run directory.

``slr run`` (``slr.run.training``), ``slr eval`` and ``slr infer`` (``slr.run.evaluation``)
and ``slr serve`` all go through ``RunLifecycle``, so each of them holds its directory,
announces itself to the plugins and ends with a ``RunStatus`` the same way:

- constructing it holds the run directory for this process (another process is refused
  with ``RunInUse``, naming the holder) and binds ``run_id`` to every log line;
- ``running(**fields)`` (a context manager) appends the ``started`` event (the run's
  ``kind`` and the fields) and fires ``on_run_started``; on the way out, on every path, it
  appends ``finished`` with the status, releases the directory and fires
  ``on_run_finished``. The body sets ``status = "completed"`` when it ended as it should;
  an exception leaves ``"failed"`` and Ctrl-C (``KeyboardInterrupt``) is ``"interrupted"``;
- ``release()`` lets the directory go when the run never started (building its parts
  failed): no event, no hook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from slr import log as slr_log
from slr.hookspecs import RunStatus
from slr.run.directory import RunDir

if TYPE_CHECKING:
    from slr.config import Config
    from slr.plugins import PluginManager

#: What made the run: the ``kind`` of its ``started`` event.
RunKind = Literal["train", "eval", "serve"]


class RunLifecycle:
    """The run directory held, the run announced, and its end recorded (module docstring)."""

    def __init__(
        self, run: RunDir, *, plugins: PluginManager, config: Config, kind: RunKind
    ) -> None:
        self.run, self.plugins, self.config, self.kind = run, plugins, config, kind
        self.status: RunStatus = "failed"
        run.hold()
        slr_log.bind(run_id=run.id)

    @contextlib.contextmanager
    def running(self, **fields: object) -> Iterator[RunLifecycle]:
        """The run from its ``started`` event to its ``finished`` one (module docstring)."""
        self.run.append_event("started", kind=self.kind, **fields)
        self.plugins.emit("on_run_started", run_dir=self.run, config=self.config)
        try:
            yield self
        except KeyboardInterrupt:
            self.status = "interrupted"
            raise
        except BaseException:
            self.status = "failed"
            raise
        finally:
            try:
                self.run.append_event("finished", status=self.status)
            finally:
                self.run.close()
                self.plugins.emit("on_run_finished", run_dir=self.run, status=self.status)

    def release(self) -> None:
        """Let the run directory go without having started the run."""
        self.run.close()
