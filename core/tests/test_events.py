"""Event hooks reach every plugin that implements them, called with keyword arguments."""

from __future__ import annotations

from slr import hookimpl
from slr.contracts import Reward, TerminationReason, TrialResult
from slr.run.directory import RunDir


class Recorder:
    def __init__(self):
        self.calls = []

    @hookimpl
    def on_run_started(self, run_dir, config):
        self.calls.append(("on_run_started", run_dir.id, config))

    @hookimpl
    def on_trial_finished(self, trial):  # a subset of the arguments is fine
        self.calls.append(("on_trial_finished", trial.trial_id))

    @hookimpl
    def on_step_finished(self, run_dir, step, metrics):
        self.calls.append(("on_step_finished", step, metrics["reward_mean"]))

    @hookimpl
    def on_run_finished(self, run_dir, status):
        self.calls.append(("on_run_finished", status))


def test_event_hooks_fire_in_order(slr_plugins, tmp_path):
    rec = Recorder()
    slr_plugins.register(rec, name="recorder")
    hook = slr_plugins.manager.hook
    run = RunDir.create(tmp_path, "ev", "")
    trial = TrialResult(
        trial_id="t1", task_id="hello", termination="completed", reward=Reward(value=1.0)
    )
    hook.on_run_started(run_dir=run, config={"x": 1})
    hook.on_trial_finished(run_dir=run, trial=trial)
    hook.on_step_finished(run_dir=run, step=3, metrics={"reward_mean": 0.5})
    hook.on_run_finished(run_dir=run, status="completed")
    assert rec.calls == [
        ("on_run_started", run.id, {"x": 1}),
        ("on_trial_finished", "t1"),
        ("on_step_finished", 3, 0.5),
        ("on_run_finished", "completed"),
    ]
    assert trial.termination is TerminationReason.COMPLETED
