"""``slr run``: start a run (or resume one) and drive it with the loop its config names.

``run.mode = "sync"`` is ``slr.run.loop.Loop`` (roll out a step, train, sync); ``"async"`` is
``slr.run.async_loop.AsyncLoop`` (rollout and training overlap, staleness bounded by admission).
Both read and write the run directory the same way, so ``--resume`` works for either.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from slr.config import Config, load_config
from slr.plugins import get_plugin_manager
from slr.run.async_loop import AsyncLoop
from slr.run.directory import RunDir
from slr.run.lifecycle import RunLifecycle
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
    # held from here: a second `slr run --resume` of the same run is refused, not interleaved
    life = RunLifecycle(run, plugins=plugins, config=config, kind="train")
    try:
        loop = (AsyncLoop if config.run.mode == "async" else Loop)(config, run, plugins)
        if resume is not None:
            loop.restore()
    except BaseException:
        life.release()
        raise
    with life.running(resumed=resume is not None, step=loop.start_step):
        try:
            life.status = asyncio.run(loop.main())
        finally:
            loop.close()
    return run
