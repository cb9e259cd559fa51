"""``slr eval``: roll out a policy on a task set ``k`` times per task, without training.

The parts are built from the run config exactly as ``slr run`` builds them (engine, proxy,
agent, backend, verifier; no optimizer), and sampling is ``[rollout]``'s, so an evaluation
measures the policy the way training sees it. Agents that call no model (``oracle``,
``nop``: ``needs_model = False``) run with stand-in sessions and no engine is loaded.

``--checkpoint`` points the engine's ``model`` option at the checkpoint's servable weights
(the model folder its optimizer names, ``Optimizer.servable_weights``, recorded in the
checkpoint; ``slr.run.checkpoints.resolve_checkpoint``), so any engine with a ``model`` option
serves it. The trials run through one ``slr.rollout.recorder.TrialRecorder``, as in ``slr run``.
The result is a run directory (``config.toml``, ``trials/``, ``events.jsonl``) plus
``eval.json``, the pass@k summary (``slr.run.passk``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any, Self

import attrs

from slr.cluster.engines import build_engine
from slr.config import EVAL_PLUGINS, Config, load_config
from slr.contracts import TrialResult
from slr.errors import UsageError
from slr.plugins import PluginManager, get_plugin_manager
from slr.rollout.recorder import TrialRecorder, TrialSpec
from slr.run.checkpoints import Checkpoint, resolve_checkpoint
from slr.run.directory import RunDir, atomic_write
from slr.run.lifecycle import RunLifecycle
from slr.run.passk import summarize
from slr.tasks import load_tasks

SUMMARY = "eval.json"


def serve_checkpoint(config: Config, ckpt: Checkpoint) -> Config:
    """``config`` with the engine's ``model`` pointed at the checkpoint's weights."""
    options = config.engine.options
    if (
        options is None
        or not attrs.has(type(options))
        or "model" not in attrs.fields_dict(type(options))
    ):
        raise UsageError(
            f"engine {config.engine.name!r} has no `model` option, so it cannot be pointed at "
            f"checkpoint {str(ckpt.path)!r}; use an engine that loads a model folder "
            f"(--engine hf, or vllm)"
        )
    served = attrs.evolve(options, model=str(ckpt.weights.resolve()))
    return attrs.evolve(config, engine=attrs.evolve(config.engine, options=served))


def engine_model(config: Config) -> str | None:
    return None if config.engine.options is None else getattr(config.engine.options, "model", None)


#: What continues an interrupted evaluation (named by the errors about its folder).
RESUME = "slr eval --resume"


def create_run_dir(config: Config, *, output: Path | None, name: str | None) -> RunDir:
    """The evaluation's new run directory: ``output`` exactly, or ``eval-<name>-<time>``."""
    if output is None:
        return RunDir.create(
            config.run.runs_dir, name or f"eval-{config.run.name}", config.to_toml()
        )
    return RunDir.create_at(Path(output), config.to_toml(), resume=RESUME)


class Evaluation:
    """One evaluation: ``samples`` trials of every task, then the pass@k summary."""

    def __init__(
        self,
        config: Config,
        *,
        samples: int,
        checkpoint: Path | None = None,
        output: Path | None = None,
        name: str | None = None,
        threshold: float = 1.0,
        plugins: PluginManager | None = None,
        resume: RunDir | None = None,
    ) -> None:
        if samples < 1:
            raise UsageError(f"-k/--samples must be at least 1, got {samples}")
        self.plugins = plugins or get_plugin_manager()
        self.samples, self.threshold = samples, threshold
        self.tasks = load_tasks(
            config.tasks.path, include=config.tasks.include, split=config.tasks.split
        )
        if not self.tasks:
            raise UsageError(f"no tasks found under tasks.path = {str(config.tasks.path)!r}")
        self.agent = self.plugins.build(config, "agent")
        self.needs_model = self.agent.needs_model
        self.checkpoint = None
        if checkpoint is not None:
            if not self.needs_model:
                raise UsageError(
                    f"agent {config.agent.name!r} calls no model, so --checkpoint has nothing "
                    f"to serve; pick an agent that calls the policy (--agent ...)"
                )
            self.checkpoint = resolve_checkpoint(checkpoint)
            config = serve_checkpoint(config, self.checkpoint)
        self.config = config
        if resume is None and output is not None:
            RunDir.check_new(Path(output), resume=RESUME)  # before the slow part below
        self.backend = self.plugins.build(config, "backend")
        self.verifier = self.plugins.build(config, "verifier")
        # last: loading the model is the slow part, so the cheap checks fail before it
        self.engine = build_engine(config, self.plugins) if self.needs_model else None
        self.run = resume or create_run_dir(config, output=output, name=name)
        self.life = RunLifecycle(self.run, plugins=self.plugins, config=config, kind="eval")

    @classmethod
    def resume(cls, path: Path, *, plugins: PluginManager | None = None) -> Self:
        """Continue an interrupted eval: run only the trials that have no record yet."""
        run = RunDir.open(path)
        started = [e for e in run.events() if e["event"] == "started" and e.get("kind") == "eval"]
        if not started:
            raise UsageError(
                f"{str(path)!r} is not an eval run (its events.jsonl has no eval 'started' "
                f"event); resume a training run with `slr run --resume`"
            )
        first = started[0]
        plugins = plugins or get_plugin_manager()
        config = load_config(
            run.path / RunDir.CONFIG,
            plugins=plugins,
            only_plugins=EVAL_PLUGINS,
        )
        return cls(
            config,
            samples=int(first["samples"]),
            checkpoint=first.get("checkpoint"),
            threshold=float(first.get("threshold", 1.0)),
            plugins=plugins,
            resume=run,
        )

    @property
    def weights_version(self) -> int | None:
        if self.engine is None:
            return None
        # the weights after training step N are version N, as in the run that wrote them
        if self.checkpoint is not None and self.checkpoint.step is not None:
            return self.checkpoint.step
        return self.engine.weights_version

    def main(self) -> dict[str, Any]:
        """Run every trial, write ``eval.json`` and return it."""
        recorded = len(self.run.trial_ids())
        if recorded:
            self.run.append_event("resumed", recorded=recorded)
        t0 = time.monotonic()
        checkpoint = None if self.checkpoint is None else str(self.checkpoint.path.resolve())
        with self.life.running(
            samples=self.samples, threshold=self.threshold, checkpoint=checkpoint
        ) as life:
            results = asyncio.run(self._main())
            life.status = "completed"
        summary = self.summary(results, elapsed_s=time.monotonic() - t0)
        atomic_write(self.run.path / SUMMARY, json.dumps(summary, indent=2, sort_keys=True))
        return summary

    def specs(self) -> list[TrialSpec]:
        """``samples`` trials of every task; ids are deterministic, so resume skips the
        recorded ones."""
        return [
            TrialSpec(task=task, trial_id=f"{task.id}-{i}", group_id=task.id)
            for task in self.tasks
            for i in range(self.samples)
        ]

    async def _main(self) -> list[TrialResult]:
        session = TrialRecorder(
            self.run,
            plugins=self.plugins,
            config=self.config,
            engine=self.engine,
            backend=self.backend,
            agent=self.agent,
            verifier=self.verifier,
            tasks=self.tasks,
            weights_version=lambda: self.weights_version,
        )
        async with session:
            return await session.run(self.specs(), label="eval")

    def summary(self, results: list[TrialResult], *, elapsed_s: float) -> dict[str, Any]:
        cfg = self.config
        out = summarize(
            results, k=self.samples, threshold=self.threshold, task_ids=[t.id for t in self.tasks]
        )
        ckpt = self.checkpoint
        out.update(
            {
                "run_id": self.run.id,
                "finished": dt.datetime.now(dt.UTC).isoformat(),
                "elapsed_s": round(elapsed_s, 3),
                "agent": cfg.agent.name,
                "backend": cfg.backend.name,
                "engine": cfg.engine.name if self.engine is not None else None,
                "model": engine_model(cfg) if self.engine is not None else None,
                "checkpoint": None if ckpt is None else str(ckpt.path.resolve()),
                "checkpoint_step": None if ckpt is None else ckpt.step,
                "checkpoint_run": None
                if ckpt is None or ckpt.run is None
                else str(ckpt.run.resolve()),
                "weights_version": self.weights_version,
                "tasks_path": str(cfg.tasks.path),
                "samples_per_task": self.samples,
                "sampling": {
                    "temperature": cfg.rollout.temperature,
                    "top_p": cfg.rollout.top_p,
                    "max_tokens": cfg.rollout.max_tokens,
                },
            }
        )
        return out
