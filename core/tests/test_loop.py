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

import attrs
import pytest

from slr import hookimpl
from slr.config import load_config
from slr.contracts import Reward, TrialResult
from slr.plugins import get_plugin_manager
from slr.run import checkpoints
from slr.run.directory import RunDir
from slr.run.loop import Loop, group_id, rollout_step, sample_tasks, step_specs, trial_id
from slr.run.training import train
from slr.tasks import load_tasks

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


def sampling_config(tmp_path: Path, *, dynamic: bool, max_oversample: int = 2):
    cfg = config(tmp_path)
    rollout = attrs.evolve(cfg.rollout, dynamic_sampling=dynamic, max_oversample=max_oversample)
    return attrs.evolve(cfg, rollout=rollout)


def stub_runner(pass_rule):
    """Stands in for the trial recorder (a stub: the wave logic is under test, not trials):
    each trial's reward is ``pass_rule(spec)``; it keeps every wave's specs."""
    waves: list[list] = []

    async def run(specs, wave):
        assert wave == len(waves)
        waves.append(list(specs))
        return [
            TrialResult(
                trial_id=s.trial_id,
                task_id=s.task.id,
                termination="completed",
                reward=Reward(value=float(pass_rule(s))),
                group_id=s.group_id,
                step=s.step,
            )
            for s in specs
        ]

    return run, waves


def slots_of(specs) -> list[int]:
    return sorted({int(s.group_id.split("-")[1]) for s in specs})


def test_dynamic_sampling_over_samples_in_waves_until_the_batch_is_informative(tmp_path):
    # hello-world groups all pass (no signal); make-directory groups pass on sample 0 only
    cfg = sampling_config(tmp_path, dynamic=True, max_oversample=2)
    tasks = load_tasks(TASKS, include=INCLUDE)
    picked = [t.id for t in sample_tasks(tasks, seed=0, step=1, count=4)]
    assert picked == ["make-directory", "hello-world", "hello-world", "make-directory"]
    run, waves = stub_runner(lambda s: s.task.id == "hello-world" or s.trial_id.endswith("-0"))
    out = asyncio.run(rollout_step(tasks, cfg, 1, run))
    # wave 1: slots 0 (signal) and 1 (none); one more each time a group has none
    assert [slots_of(w) for w in waves] == [[0, 1], [2], [3]]
    assert slots_of(out.trials) == [0, 3] and len(out.trials) == 4
    assert (out.oversampled, out.dropped_no_signal) == (2, 2)
    # the budget runs out before two informative groups: the earliest flat group fills in
    cfg = sampling_config(tmp_path, dynamic=True, max_oversample=1)
    run, waves = stub_runner(lambda s: s.task.id == "hello-world" or s.trial_id.endswith("-0"))
    out = asyncio.run(rollout_step(tasks, cfg, 1, run))
    assert [slots_of(w) for w in waves] == [[0, 1], [2]]
    assert slots_of(out.trials) == [0, 1] and (out.oversampled, out.dropped_no_signal) == (1, 1)


def test_without_dynamic_sampling_a_step_is_its_groups_whatever_their_rewards(tmp_path):
    tasks = load_tasks(TASKS, include=INCLUDE)
    run, waves = stub_runner(lambda s: True)  # every group without signal
    out = asyncio.run(rollout_step(tasks, sampling_config(tmp_path, dynamic=False), 1, run))
    assert [slots_of(w) for w in waves] == [[0, 1]]
    assert waves[0] == step_specs(tasks, config(tmp_path), 1)
    assert (len(out.trials), out.oversampled, out.dropped_no_signal) == (4, 0, 0)
    # all flat, with the feature: two more groups (a wave of two), then the first two fill in
    run, waves = stub_runner(lambda s: True)
    out = asyncio.run(rollout_step(tasks, sampling_config(tmp_path, dynamic=True), 1, run))
    assert [slots_of(w) for w in waves] == [[0, 1], [2, 3]]
    assert slots_of(out.trials) == [0, 1] and (out.oversampled, out.dropped_no_signal) == (2, 2)


def test_a_steps_over_samples_extend_its_task_order_without_changing_it(tmp_path):
    cfg = config(tmp_path)
    tasks = load_tasks(TASKS, include=INCLUDE)
    first = step_specs(tasks, cfg, 5)
    more = step_specs(tasks, cfg, 5, slots=range(0, 4))
    assert more[: len(first)] == first
    assert step_specs(tasks, cfg, 5, slots=range(2, 4)) == more[len(first) :]


@pytest.mark.slow
def test_a_run_records_each_trial_once_and_checkpoints_servable_weights(
    tmp_path, tiny_model_dir, counter
):
    run = train(config(tmp_path, tiny_model_dir, steps=2))
    assert counter.calls == recorded_files(run) and set(counter.calls.values()) == {1}
    assert Counter(t.step for t in run.trials()) == {1: 4, 2: 4}
    assert all(t.weights_version == t.step - 1 for t in run.trials())
    assert [m["step"] for m in run.metrics()] == [1, 2]
    assert all(m["weights/unpublished_tokens"] == 0 for m in run.metrics())
    latest = checkpoints.latest_checkpoint(run)
    assert latest == checkpoints.checkpoint_dir(run, 2)
    state = checkpoints.read_state(latest)
    assert state.step == 2 and state.servable_weights == "policy"
    assert checkpoints.resolve_checkpoint(run.path).weights == latest / "policy"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sync_step_with_dynamic_sampling_trains_a_full_batch_and_counts_the_rest(
    tmp_path, tiny_model_dir
):
    # the oracle passes every trial: no group has a signal, so the step over-samples its
    # whole budget (one group) and trains its first two groups
    cfg = config(tmp_path, tiny_model_dir, steps=1)
    cfg = attrs.evolve(
        cfg, rollout=attrs.evolve(cfg.rollout, dynamic_sampling=True, max_oversample=1)
    )
    run = train(cfg)
    (m,) = run.metrics()
    assert (m["groups/oversampled"], m["groups/dropped_no_signal"]) == (1, 1)
    assert m["trials/total"] == 4, "the optimizer got the batch, not the dropped group"
    slots = Counter(t.group_id.split("-")[1] for t in run.trials() if t.group_id)
    assert slots == {"00": 2, "01": 2, "02": 2}


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
