"""``slr eval``: roll out a policy on a task set ``k`` times per task, without training.

The parts are built from the run config exactly as ``slr run`` builds them (engine, proxy,
agent, backend, verifier; no optimizer), and sampling is ``[rollout]``'s, so an evaluation
measures the policy the way training sees it. Agents that call no model (``oracle``,
``nop``: ``needs_model = False``) run with stand-in sessions and no engine is loaded.

``--checkpoint`` points the engine's ``model`` option at a checkpoint's ``policy/`` folder
(the Hugging Face model the torch optimizer writes), so any engine with a ``model`` option
serves it. The result is a run directory (``config.toml``, ``trials/``, ``events.jsonl``)
plus ``eval.json``, the pass@k summary (``slr.passk``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import time
from pathlib import Path
from typing import Any

import attrs

from slr.config import Config, load_config
from slr.contracts import SamplingParams, TrialResult
from slr.errors import UsageError
from slr.loop import build_plugin, record_trial
from slr.passk import summarize
from slr.plugins import PluginManager, get_plugin_manager
from slr.proxy import Proxy, ProxySessions
from slr.runs import RunDir, atomic_write
from slr.tasks import Task, load_tasks
from slr.trial import StandInSessions, run_trial, run_trials

SUMMARY = "eval.json"
_WHAT_TO_PASS = (
    "pass a checkpoint folder (RUN/checkpoints/step-NNNNNN) or a run directory (RUN, "
    "meaning its latest complete checkpoint)"
)


@attrs.frozen(kw_only=True)
class Checkpoint:
    """A complete training checkpoint and the model folder an engine can serve."""

    path: Path
    policy: Path
    step: int | None
    run: Path | None


def resolve_checkpoint(path: Path | str) -> Checkpoint:
    """The checkpoint ``path`` names: a checkpoint folder, or a run's latest complete one."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"--checkpoint {str(path)!r} is not a folder; {_WHAT_TO_PASS}")
    run: Path | None = None
    if (path / RunDir.CONFIG).is_file():
        run = path
        latest = RunDir(path).latest_checkpoint()
        if latest is None:
            raise UsageError(
                f"run {str(path)!r} has no complete checkpoint yet (no checkpoints/step-*/"
                f"COMPLETE); wait for its first checkpoint (run.checkpoint_every) or "
                f"evaluate the base model without --checkpoint"
            )
        path = latest
    elif (path.parent.parent / RunDir.CONFIG).is_file():
        run = path.parent.parent
    if not (path / "COMPLETE").is_file():
        hint = ""
        if run is not None and (latest := RunDir(run).latest_checkpoint()) is not None:
            hint = f" The run's latest complete checkpoint is {str(latest)!r}."
        raise UsageError(
            f"{str(path)!r} is not a complete checkpoint (no COMPLETE marker: it is being "
            f"written, was interrupted, or is not a checkpoint at all); {_WHAT_TO_PASS}.{hint}"
        )
    policy = path / "policy"
    if not (policy / "config.json").is_file():
        raise UsageError(
            f"checkpoint {str(path)!r} has no policy/ model folder (policy/config.json), so "
            f"there are no weights an engine can serve; its optimizer does not export a "
            f"Hugging Face model. Evaluate a checkpoint of the torch optimizer, or pass the "
            f"model folder as --set engine.model=PATH"
        )
    return Checkpoint(path=path, policy=policy, step=_step(path), run=run)


def _step(path: Path) -> int | None:
    try:
        return int(json.loads((path / "loop.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        found = re.fullmatch(r"step-(\d+)", path.name)
        return int(found.group(1)) if found else None


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
    served = attrs.evolve(options, model=str(ckpt.policy.resolve()))
    return attrs.evolve(config, engine=attrs.evolve(config.engine, options=served))


def engine_model(config: Config) -> str | None:
    return None if config.engine.options is None else getattr(config.engine.options, "model", None)


def check_output(output: Path | None) -> None:
    if output is not None and output.exists() and any(output.iterdir()):
        raise UsageError(
            f"--output {str(output)!r} exists and is not empty; pick a new folder, drop "
            f"--output to get eval-<name>-<time> under run.runs_dir, or finish an "
            f"interrupted eval with --resume"
        )


def create_run_dir(config: Config, *, output: Path | None, name: str | None) -> RunDir:
    if output is None:
        return RunDir.create(
            config.run.runs_dir, name or f"eval-{config.run.name}", config.to_toml()
        )
    output = Path(output)
    check_output(output)
    (output / "trials").mkdir(parents=True, exist_ok=True)
    atomic_write(output / RunDir.CONFIG, config.to_toml())
    return RunDir(output)


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
        self.tasks = load_tasks(config.tasks.path, include=config.tasks.include)
        if not self.tasks:
            raise UsageError(f"no tasks found under tasks.path = {str(config.tasks.path)!r}")
        self.agent = build_plugin(config, self.plugins, "agent")
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
        if resume is None:
            check_output(None if output is None else Path(output))
        self.backend = build_plugin(config, self.plugins, "backend")
        self.verifier = build_plugin(config, self.plugins, "verifier")
        # last: loading the model is the slow part, so the cheap checks fail before it
        self.engine = build_plugin(config, self.plugins, "engine") if self.needs_model else None
        self.run = resume or create_run_dir(config, output=output, name=name)
        self.recorded = {t.trial_id: t for t in self.run.trials()} if resume else {}

    @classmethod
    def resume(cls, path: Path, *, plugins: PluginManager | None = None) -> Evaluation:
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
            only_plugins=("agent", "backend", "engine", "verifier"),
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
        if self.recorded:
            self.run.append_event("resumed", recorded=len(self.recorded))
        self.run.append_event(
            "started",
            kind="eval",
            samples=self.samples,
            threshold=self.threshold,
            checkpoint=None if self.checkpoint is None else str(self.checkpoint.path.resolve()),
        )
        t0 = time.monotonic()
        status = "failed"
        try:
            results = asyncio.run(self._main())
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.run.append_event("finished", status=status)
            self.run.close()
        summary = self.summary(results, elapsed_s=time.monotonic() - t0)
        atomic_write(self.run.path / SUMMARY, json.dumps(summary, indent=2, sort_keys=True))
        return summary

    async def _main(self) -> list[TrialResult]:
        try:
            await self.backend.cleanup_orphans()
            for task in {t.id: t for t in self.tasks}.values():
                await self.backend.prepare(task)
            if self.engine is None:
                return await self._trials(StandInSessions())
            rollout = self.config.rollout
            sampling = SamplingParams(
                temperature=rollout.temperature, top_p=rollout.top_p, max_tokens=rollout.max_tokens
            )
            async with Proxy(self.engine, self.config.proxy, sampling=sampling) as proxy:
                sessions = ProxySessions(
                    proxy, protocol=self.agent.protocol, transcripts=self.run.path / "trials"
                )
                return await self._trials(sessions)
        finally:
            await self.backend.close()
            if self.engine is not None:
                await self.engine.close()

    async def _trials(self, sessions: Any) -> list[TrialResult]:
        # trial ids are deterministic, so a resumed eval runs only what has no record
        ids = [(task, f"{task.id}-{i}") for task in self.tasks for i in range(self.samples)]
        jobs = [self._job(t, tid, sessions) for t, tid in ids if tid not in self.recorded]
        done = await run_trials(jobs, concurrency=self.config.rollout.concurrency, label="eval")
        return [*self.recorded.values(), *done]

    def _job(self, task: Task, tid: str, sessions: Any):
        async def job() -> TrialResult:
            result = await run_trial(
                task,
                backend=self.backend,
                agent=self.agent,
                verifier=self.verifier,
                session_factory=sessions,
                trial_id=tid,
                agent_name=self.config.agent.name,
                labels={"slr.run": self.run.id, "slr.trial": tid},
                group_id=task.id,
            )
            result = attrs.evolve(result, weights_version=self.weights_version)
            record_trial(self.run, self.plugins, result)
            return result

        return job

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
