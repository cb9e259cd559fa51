"""One run lifecycle for every command that makes a run directory (``slr.run.lifecycle``):
``slr run``, ``slr eval``, ``slr infer`` and ``slr serve`` each hold their directory, fire
``on_run_started`` and ``on_run_finished`` once, and end with a ``RunStatus``.

Each command runs for real in this process: the model-free ``oracle`` agent on the local
backend, and (for ``run`` and ``serve``) the embedded hf engine on a tiny random model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path
from typing import get_args

import pytest

from slr import hookimpl
from slr.config import load_config
from slr.hookspecs import RunStatus
from slr.plugins import get_plugin_manager
from slr.run.directory import RunDir, RunInUse
from slr.run.lifecycle import RunLifecycle

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"


class RunEvents:
    """Every run event, in order: (hook, run id, status or None)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None]] = []
        self.on_start = lambda: None

    @hookimpl
    def on_run_started(self, run_dir, config):
        # the run is held while it is announced: a second process could not take it
        assert run_dir.holder() is not None
        self.calls.append(("on_run_started", run_dir.id, None))
        self.on_start()

    @hookimpl
    def on_run_finished(self, run_dir, status):
        self.calls.append(("on_run_finished", run_dir.id, status))


@pytest.fixture
def events(slr_plugins) -> RunEvents:
    recorder = RunEvents()
    slr_plugins.register(recorder, name="run-events")
    return recorder


def config(tmp_path: Path, model: Path | None = None, **run):
    data = {
        "run": {"name": "life", "runs_dir": str(tmp_path / "runs"), "steps": 1, **run},
        "tasks": {"path": str(TASKS), "include": ["hello-world"]},
        "rollout": {"tasks_per_step": 1, "n_per_task": 2, "concurrency": 2, "max_tokens": 8},
        "agent": {"name": "oracle"},
        "backend": {"name": "local"},
        "engine": {"name": "hf", "model": str(model or "unused")},
    }
    only = None if model is not None else ("agent", "backend")
    return load_config(data=data, plugins=get_plugin_manager(), only_plugins=only)


def assert_one_life(events: RunEvents, run: RunDir, status: str, kind: str) -> None:
    assert events.calls == [
        ("on_run_started", run.id, None),
        ("on_run_finished", run.id, status),
    ]
    started = [e for e in run.events() if e["event"] == "started"]
    finished = [e for e in run.events() if e["event"] == "finished"]
    assert [e["kind"] for e in started] == [kind]
    assert [e["status"] for e in finished] == [status]
    assert status in get_args(RunStatus)
    assert run.holder() is None, "the run directory is released when the run ends"


@pytest.mark.slow
def test_slr_run_fires_the_run_hooks(tmp_path, tiny_model_dir, events):
    from slr.run.training import train

    run = train(config(tmp_path, tiny_model_dir))
    assert_one_life(events, run, "completed", "train")


@pytest.mark.slow
def test_slr_eval_fires_the_run_hooks(tmp_path, events):
    from slr.run.evaluation import Evaluation

    evaluation = Evaluation(config(tmp_path), samples=2, output=tmp_path / "eval")
    summary = evaluation.main()
    assert summary["pass_at"]["1"] == 1.0
    assert_one_life(events, RunDir.open(tmp_path / "eval"), "completed", "eval")


@pytest.mark.slow
def test_slr_infer_fires_the_run_hooks(tmp_path, events):
    from slr_data.infer import Inference

    Inference(config(tmp_path), samples=1, output=tmp_path / "infer").main()
    assert_one_life(events, RunDir.open(tmp_path / "infer"), "completed", "eval")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_slr_serve_fires_the_run_hooks_and_ends_completed(tmp_path, tiny_model_dir, events):
    """Served until Ctrl-C (SIGINT, what a person sends): a completed run, not an unknown
    status (it was 'stopped', which is no RunStatus)."""
    from slr_cli.serve_cmd import _serve

    cfg = config(tmp_path, tiny_model_dir)

    announced = threading.Event()
    events.on_start = announced.set

    def interrupt_once_served() -> None:
        # the run is announced (on_run_started) before the proxy starts; Ctrl-C then (or
        # after two minutes, so a serve that never announces itself ends and fails below)
        announced.wait(120)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_served, daemon=True).start()
    asyncio.run(_serve(cfg, 1))
    (path,) = (tmp_path / "runs").iterdir()
    run = RunDir.open(path)
    assert_one_life(events, run, "completed", "serve")
    assert run.trial_ids() == {"session-0"}


def test_a_failure_is_failed_and_ctrl_c_is_interrupted(tmp_path, events):
    for raised, status in ((RuntimeError("boom"), "failed"), (KeyboardInterrupt(), "interrupted")):
        events.calls.clear()
        run = RunDir.create(tmp_path / "runs", "life", "")
        life = RunLifecycle(run, plugins=get_plugin_manager(), config=None, kind="train")  # type: ignore[arg-type]
        with pytest.raises(type(raised)), life.running():
            raise raised
        assert_one_life(events, run, status, "train")


def test_the_run_is_held_from_the_start_and_released_without_a_start(tmp_path, events):
    from slr_testkit.runs import held_by_another_process

    run = RunDir.create(tmp_path / "runs", "life", "")
    life = RunLifecycle(run, plugins=get_plugin_manager(), config=None, kind="eval")  # type: ignore[arg-type]
    assert run.holder() is not None
    life.release()  # building the run's parts failed: nothing announced, nothing recorded
    assert run.holder() is None and events.calls == [] and run.events() == []
    with held_by_another_process(run.path), pytest.raises(RunInUse):
        RunLifecycle(RunDir.open(run.path), plugins=get_plugin_manager(), config=None, kind="eval")  # type: ignore[arg-type]
