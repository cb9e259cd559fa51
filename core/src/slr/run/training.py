"""``slr run``: start a run (or resume one) and drive it with the loop its config names.

``run.mode = "sync"`` is ``slr.run.loop.Loop`` (roll out a step, train, sync); ``"async"`` is
``slr.run.async_loop.AsyncLoop`` (rollout and training overlap, staleness bounded by admission).
Both read and write the run directory the same way, so ``--resume`` works for either.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from slr import log as slr_log
from slr.config import Config, load_config
from slr.plugins import get_plugin_manager
from slr.rollout.recorder import emit
from slr.run.async_loop import AsyncLoop
from slr.run.directory import RunDir
from slr.run.loop import Loop


def train(
    config: Config | None, *, resume: Path | None = None, output: Path | None = None
) -> RunDir:
    """``slr run``: a new run from ``config`` (in ``output`` when given, else a new
    ``<name>-<time>`` under ``run.runs_dir``), or continue the run in ``resume``."""
    plugins = get_plugin_manager()
    if resume is not None:
        run = RunDir.open(resume)
        config = load_config(run.path / RunDir.CONFIG, plugins=plugins)
    else:
        assert config is not None
        if output is not None:
            run = RunDir.create_at(output, config.to_toml())
        else:
            run = RunDir.create(config.run.runs_dir, config.run.name, config.to_toml())
    run.hold()  # a second `slr run --resume` of the same run is refused, not interleaved
    slr_log.bind(run_id=run.id)
    loop = (AsyncLoop if config.run.mode == "async" else Loop)(config, run, plugins)
    if resume is not None:
        loop.restore()
    run.append_event("started", resumed=resume is not None, step=loop.start_step)
    emit(plugins, "on_run_started", run_dir=run, config=config)
    status = "failed"
    try:
        status = asyncio.run(loop.main())
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        loop.close()
        run.append_event("finished", status=status)
        run.close()
        emit(plugins, "on_run_finished", run_dir=run, status=status)
    return run
