"""The training loop in-process: steps, checkpoints, and each trial recorded exactly once on a
whole run, a cancelled run and its resume.

The agent is the model-free ``oracle`` on the real local backend; the engine and optimizer
are the embedded defaults on a tiny random model, so the loop's bookkeeping is what is under
test (tests/e2e runs the same through the ``slr`` command and SIGKILL).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from slr import checkpoints, hookimpl
from slr.config import load_config
from slr.loop import Loop, group_id, step_specs, trial_id
from slr.plugins import get_plugin_manager
from slr.runs import RunDir
from slr.tasks import load_tasks
from slr.training import train

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
INCLUDE = ["hello-world", "make-directory"]


class TrialCounter:
    def __init__(self):
        self.calls: Counter[str] = Counter()
        self.then = None

    @hookimpl
    def on_trial_finished(self, run_dir, trial):
        self.calls[trial.trial_id] += 1
        if self.then is not None:
            self.then(trial)


@pytest.fixture
def counter(slr_plugins):
    c = TrialCounter()
    slr_plugins.register(c, name="trial-counter")
    return c


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    from slr_engine_hf import tiny

    model, tok = tiny.tiny_model(hidden=32, layers=1)
    return tiny.save(model, tok, tmp_path_factory.mktemp("tiny") / "model")


def config(tmp_path: Path, model: Path | None = None, *, steps: int = 2, concurrency: int = 2):
    rollout = {"tasks_per_step": 2, "n_per_task": 2, "concurrency": concurrency, "max_tokens": 8}
    data = {
        "run": {"name": "loop", "runs_dir": str(tmp_path / "runs"), "steps": steps},
        "tasks": {"path": str(TASKS), "include": INCLUDE},
        "rollout": rollout,
        "agent": {"name": "oracle"},
        "backend": {"name": "local"},
        "engine": {"name": "hf", "model": str(model or "unused")},
    }
    only = None if model is not None else ("agent", "backend")
    return load_config(data=data, plugins=get_plugin_manager(), only_plugins=only)


def recorded_files(run: RunDir) -> Counter[str]:
    return Counter(p.stem for p in (run.path / "trials").glob("*.json"))


def test_a_step_is_groups_of_deterministic_ids_that_match_the_documented_format(tmp_path):
    cfg = config(tmp_path)
    tasks = load_tasks(TASKS, include=INCLUDE)
    specs = step_specs(tasks, cfg, 3)
    assert specs == step_specs(tasks, cfg, 3), "a resumed step samples the same trials"
    assert len(specs) == 4 and len({s.trial_id for s in specs}) == 4
    first = specs[0]
    assert first.trial_id == trial_id(3, first.task, 0, 0) == f"s00003-00-{first.task.id}-0"
    assert first.group_id == group_id(3, first.task, 0) == f"s00003-00-{first.task.id}"
    assert Counter(s.group_id for s in specs) == {specs[0].group_id: 2, specs[2].group_id: 2}
    assert all(s.step == 3 for s in specs)


@pytest.mark.slow
def test_a_run_records_each_trial_once_and_checkpoints_servable_weights(
    tmp_path, tiny_model_dir, counter
):
    run = train(config(tmp_path, tiny_model_dir, steps=2))
    assert counter.calls == recorded_files(run) and set(counter.calls.values()) == {1}
    assert Counter(t.step for t in run.trials()) == {1: 4, 2: 4}
    assert all(t.weights_version == t.step - 1 for t in run.trials())
    assert [m["step"] for m in run.metrics()] == [1, 2]
    latest = checkpoints.latest_checkpoint(run)
    assert latest == checkpoints.checkpoint_dir(run, 2)
    state = checkpoints.read_state(latest)
    assert state.step == 2 and state.servable_weights == "policy"
    assert checkpoints.resolve_checkpoint(run.path).weights == latest / "policy"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cancelled_run_resumes_with_each_trial_recorded_exactly_once(
    tmp_path, tiny_model_dir, counter
):
    # one trial at a time, so exactly one trial of step 2 has ended when the cancel comes
    cfg = config(tmp_path, tiny_model_dir, steps=2, concurrency=1)
    plugins = get_plugin_manager()
    run = RunDir.create(cfg.run.runs_dir, cfg.run.name, cfg.to_toml())

    async def until_cancelled():
        main = asyncio.current_task()

        def cancel_in_step_two(trial):
            if trial.step == 2:
                counter.then = None
                main.cancel()  # as Ctrl-C does: the loop's task is cancelled mid-rollout

        counter.then = cancel_in_step_two
        await Loop(cfg, run, plugins).main()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(until_cancelled())
    cut = Counter(counter.calls)
    assert cut == recorded_files(run) and set(cut.values()) == {1}
    steps = Counter(t.step for t in run.trials())
    assert steps == {1: 4, 2: 1}, steps

    resumed = Loop(cfg, RunDir.open(run.path), plugins)
    resumed.restore()
    assert resumed.start_step == 2
    asyncio.run(resumed.main())
    assert recorded_files(run) == counter.calls and set(counter.calls.values()) == {1}
    assert Counter(t.step for t in run.trials()) == {1: 4, 2: 4}
    assert {k: counter.calls[k] for k in cut} == cut, "a recorded trial ran again on resume"
