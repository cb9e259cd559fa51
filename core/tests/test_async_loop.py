"""The asynchronous loop (``run.mode = "async"``): staleness admission, dynamic sampling,
the warm pool fed ahead of the groups, deterministic group ids, and resume after a real
SIGKILL.

Real pieces throughout: the local backend, the embedded hf engine and torch optimizer on a
tiny random model. In-process runs use an agent that makes one real model call through the
proxy (so trained trials carry per-token weight versions) and then runs the task's
solution; the SIGKILL test runs ``slr run`` with the model-free ``oracle`` (the loop's
bookkeeping is what is under test). To stay cheap, batches are one group of two trials, and
one run serves both the staleness-0 and the dynamic-sampling test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from slr import hookimpl
from slr.agents.model_free import OracleAgent
from slr.config import load_config
from slr.contracts import AgentOutcome, Reward, TrialResult
from slr.plugins import PluginManager, get_plugin_manager, set_plugin_manager
from slr.run import checkpoints
from slr.run.async_loop import (
    AsyncLoop,
    Group,
    StepWindow,
    async_group_id,
    group_seq,
    group_specs,
    task_of_group,
    token_versions,
)
from slr.run.directory import RunDir
from slr.run.loop import Loop
from slr.run.training import train
from slr.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
INCLUDE = ["hello-world", "make-directory"]
SLR = str(Path(sys.executable).with_name("slr"))


# what the calling oracle runs in the sandbox: the endpoint is the sandbox's own (through
# its proxy link), reachable from inside it only, as for any real scaffold
CALL_MODEL = """
import json, sys, urllib.request
url, key, model = sys.argv[1:4]
body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
request = urllib.request.Request(
    url + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
)
urllib.request.urlopen(request, timeout=120).read()
"""


class CallingOracle(OracleAgent):
    """One real model call from inside the sandbox through the proxy (tokens to train
    on), then the task's solution."""

    needs_model = True

    async def run(self, sandbox, instruction, endpoint, *, timeout_s, task=None) -> AgentOutcome:
        argv = ["python3", "-c", CALL_MODEL, endpoint.base_url, endpoint.api_key, endpoint.model]
        res = await sandbox.exec(argv, timeout_s=timeout_s)
        if not res.ok:
            raise RuntimeError(f"the model call failed: {res.stderr[-500:]}")
        return await super().run(sandbox, instruction, endpoint, timeout_s=timeout_s, task=task)


class CallingOraclePlugin:
    @hookimpl
    def register_agents(self, register):
        register("calling-oracle", CallingOracle)


@contextlib.contextmanager
def calling_oracle_registered() -> Iterator[None]:
    """The installed plugins plus ``calling-oracle``, for a run shared by a module."""
    previous = get_plugin_manager()
    manager = PluginManager()
    manager.register_plugin(CallingOraclePlugin(), name="calling-oracle", version="test")
    set_plugin_manager(manager)
    try:
        yield
    finally:
        set_plugin_manager(previous)


def data(tmp_path: Path, model: Path, *, steps: int, agent: str = "oracle", **rollout) -> dict:
    # one group of two per step: the smallest batch that has a group-relative signal
    return {
        "run": {
            "name": "async",
            "runs_dir": str(tmp_path / "runs"),
            "steps": steps,
            "mode": "async",
        },
        "tasks": {"path": str(TASKS), "include": INCLUDE},
        "rollout": {
            "tasks_per_step": 1,
            "n_per_task": 2,
            "concurrency": 4,
            "max_tokens": 8,
            **rollout,
        },
        "agent": {"name": agent},
        "backend": {"name": "local"},
        "engine": {"name": "hf", "model": str(model)},
    }


def calling_run(tmp_path: Path, model: Path, *, steps: int, **rollout) -> RunDir:
    with calling_oracle_registered():
        cfg = load_config(
            data=data(tmp_path, model, steps=steps, agent="calling-oracle", **rollout),
            plugins=get_plugin_manager(),
        )
        return train(cfg)


def trained_per_step(run: RunDir, steps: int) -> dict[int, set[str]]:
    """The groups each step trained on, from the checkpoints' cumulative lists."""
    out, before = {}, set()
    for s in range(1, steps + 1):
        now = set(checkpoints.read_state(checkpoints.checkpoint_dir(run, s)).trained_groups)
        assert before <= now, "a checkpoint forgot a trained group"
        out[s], before = now - before, now
    return out


def by_group(run: RunDir) -> dict[str, list[TrialResult]]:
    out: dict[str, list[TrialResult]] = {}
    for t in run.trials():
        out.setdefault(t.group_id or "", []).append(t)
    return out


def policy_token_versions(trials: list[TrialResult]) -> list[int]:
    """The recorded version of every policy token; each trial must have generated some
    (else the versions would be the trials' start versions, and prove nothing)."""
    out: list[int] = []
    for t in trials:
        assert t.termination.value == "completed" and t.trajectory is not None, t.error
        seg_versions = [len(s.weights_versions) for s in t.trajectory.segments]
        assert sum(seg_versions) > 0, f"{t.trial_id} recorded no per-token versions"
        out.extend(token_versions(t))
    return out


def test_group_ids_are_deterministic_and_parse_back():
    tasks = load_tasks(TASKS, include=INCLUDE)
    firsts = [task_of_group(tasks, seed=0, seq=g).id for g in range(4)]
    assert firsts == [task_of_group(tasks, seed=0, seq=g).id for g in range(4)]
    assert sorted(firsts[:2]) == sorted(INCLUDE), "each block is a pass over the tasks"
    specs = group_specs(tasks, seed=0, seq=123, n=2)
    assert specs[1].trial_id == f"g000123-{specs[1].task.id}-1"
    assert specs[0].group_id == async_group_id(123, specs[0].task)
    assert group_seq(specs[0].group_id) == 123 and group_seq("s00001-00-x") is None


def bookkeeping_loop(tmp_path: Path, monkeypatch, **rollout) -> AsyncLoop:
    """An ``AsyncLoop`` whose parts are never built (a stub ``Loop.__init__``: only the
    loop's group bookkeeping is under test, which reads the config and the tasks)."""
    cfg = load_config(
        data=data(tmp_path, Path("unused"), steps=2, **rollout),
        plugins=get_plugin_manager(),
        only_plugins=("agent", "backend"),
    )

    def parts_not_built(self, config, run, plugins):
        self.config, self.tasks = config, load_tasks(TASKS, include=INCLUDE)

    monkeypatch.setattr(Loop, "__init__", parts_not_built)
    return AsyncLoop(cfg, None, None)


def finished_group(loop: AsyncLoop, seq: int, rewards: tuple[float, ...]) -> Group:
    specs = loop._specs(seq)
    trials = [
        TrialResult(
            trial_id=s.trial_id,
            task_id=s.task.id,
            termination="completed",
            reward=Reward(value=r),
            group_id=s.group_id,
            weights_version=0,
        )
        for s, r in zip(specs, rewards, strict=True)
    ]
    return Group(seq=seq, specs=specs, version=0, trials=trials)


def test_oversampled_counts_the_groups_replaced_on_the_steps_own_budget(tmp_path, monkeypatch):
    # The budget (max_oversample per step) runs from one batch taken to the next; the
    # metrics window from one weight update to the next. A group dropped while step 1
    # trains is in step 1's window but on step 2's budget: step 1 over-sampled one group,
    # as the sync loop's oversampled(...) counts it, not the window's two drops.
    loop = bookkeeping_loop(tmp_path, monkeypatch, dynamic_sampling=True, max_oversample=1)
    flat, mixed = (1.0, 1.0), (1.0, 0.0)

    async def two_steps() -> list[dict[str, int]]:
        loop.ahead = 4
        loop._finished(finished_group(loop, 0, flat))  # dropped: step 1's budget
        loop._finished(finished_group(loop, 1, flat))  # budget spent: kept
        (first,) = await loop._take_batch(1)
        assert first.seq == 1
        loop._finished(finished_group(loop, 2, flat))  # while step 1 trains: step 2's budget
        window, loop.window = loop.window, StepWindow()  # step 1's weights are out
        one = window.groups_metrics(trained=1)
        loop._finished(finished_group(loop, 3, mixed))
        (second,) = await loop._take_batch(2)
        assert second.seq == 3
        return [one, loop.window.groups_metrics(trained=1)]

    one, two = asyncio.run(two_steps())
    assert [one["groups/dropped_no_signal"], two["groups/dropped_no_signal"]] == [2, 0]
    assert [one["groups/oversampled"], two["groups/oversampled"]] == [1, 1]


@pytest.fixture(scope="module")
def on_policy_run(tmp_path_factory, tiny_model_dir) -> RunDir:
    """One run shared by two tests: max_staleness = 0, and dynamic sampling with one extra
    group per step. The calling oracle passes every trial, so no group has a signal: each
    step drops one group and trains the next (the budget is spent)."""
    return calling_run(
        tmp_path_factory.mktemp("on-policy"),
        tiny_model_dir,
        steps=2,
        max_staleness=0,
        dynamic_sampling=True,
        max_oversample=1,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_staleness_0_trains_only_tokens_of_the_weights_being_updated(on_policy_run):
    run = on_policy_run
    groups = by_group(run)
    for step, trained in trained_per_step(run, 2).items():
        assert len(trained) == 1
        versions = policy_token_versions([t for g in trained for t in groups[g]])
        assert set(versions) == {step - 1}, (step, versions)
    metrics = run.metrics()
    assert all(m["staleness/age_max"] == 0 and m["groups/dropped_stale"] == 0 for m in metrics)
    # admission blocked the starts instead of throwing work away: every group that started
    # was trained or left out by dynamic sampling, none more
    started = sum(m["groups/started"] for m in metrics)
    assert started == sum(m["groups/trained"] + m["groups/dropped_no_signal"] for m in metrics)
    assert len(groups) == started


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dynamic_sampling_replaces_groups_without_signal(on_policy_run):
    metrics = on_policy_run.metrics()
    assert [m["groups/dropped_no_signal"] for m in metrics] == [1, 1]
    assert [m["groups/oversampled"] for m in metrics] == [1, 1]
    assert [m["groups/trained"] for m in metrics] == [1, 1]
    assert [m["groups/started"] for m in metrics] == [2, 2]
    groups = Counter(t.group_id for t in on_policy_run.trials())
    assert len(groups) == 4 and set(groups.values()) == {2}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_staleness_1_overlaps_steps_within_the_bound_and_feeds_the_warm_pool(
    tmp_path, tiny_model_dir
):
    steps = 3
    # six slots: without admission the third group would start at once, under version 0,
    # and be trained by step 3 (two versions old); admission holds it until version 1
    run = calling_run(
        tmp_path, tiny_model_dir, steps=steps, max_staleness=1, pool_size=2, concurrency=6
    )
    groups = by_group(run)
    per_step = trained_per_step(run, steps)
    for step, trained in per_step.items():
        assert len(trained) == 1
        versions = policy_token_versions([t for g in trained for t in groups[g]])
        assert all(step - 2 <= v <= step - 1 for v in versions), (step, versions)
    # admission, not the drop rule, kept it there: no finished group was too stale
    assert all(
        m["staleness/age_max"] <= 1 and m["groups/dropped_stale"] == 0 for m in run.metrics()
    )
    # rollout did not wait for the trainer: step 2's group started under version 0, with
    # step 1's (admission lets a group start one version ahead)
    (second,) = per_step[2]
    assert {t.weights_version for t in groups[second]} == {0}
    # the rollouter announced its groups before starting them: the pool served the first
    # group's trials (a pool that is told nothing serves none)
    first = min(groups, key=lambda g: group_seq(g) or 0)
    assert group_seq(first) == 0
    assert all(t.costs is not None and t.costs.pool_start_s is not None for t in groups[first])


def write_config(path: Path, model: Path, *, steps: int) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(data(path.parent, model, steps=steps, max_staleness=1)))
    return path


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigkill_then_resume_trains_no_group_twice(tmp_path, tiny_model_dir):
    steps = 3
    cfg = write_config(tmp_path / "run.toml", tiny_model_dir, steps=steps)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [SLR, "run", "-c", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def reached() -> bool:
        # step 1 is checkpointed and groups beyond its batch are recorded
        if not runs.exists() or not any(runs.iterdir()):
            return False
        path = next(runs.iterdir())
        done = checkpoints.is_complete(checkpoints.checkpoint_dir(path, 1))
        return done and len(list(path.glob("trials/g*.json"))) > 2

    deadline = time.monotonic() + 200
    while not reached():
        assert proc.poll() is None, "the run ended before the kill"
        assert time.monotonic() < deadline, "the run never got past step 1"
        time.sleep(0.05)  # polling the run directory, not synchronising on time
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (path,) = list(runs.iterdir())
    before = {p.name: p.read_bytes() for p in (path / "trials").glob("*.json")}

    res = subprocess.run(
        [SLR, "run", "--resume", str(path)], capture_output=True, text=True, timeout=200
    )
    assert res.returncode == 0, res.stderr[-3000:]
    run = RunDir.open(path)
    assert [m["step"] for m in run.metrics()] == list(range(1, steps + 1))
    per_step = trained_per_step(run, steps)
    trained = [g for groups in per_step.values() for g in groups]
    assert len(trained) == len(set(trained)) == steps, "a group was trained twice"
    # the staleness bound (1) holds across the resume: recovered groups were judged too
    groups = by_group(run)
    for step, trained_now in per_step.items():
        starts = {t.weights_version for g in trained_now for t in groups[g]}
        assert all(v is not None and step - 2 <= v <= step - 1 for v in starts), (step, starts)
    after = {p.name: p.read_bytes() for p in (path / "trials").glob("*.json")}
    kept = {k: v for k, v in before.items() if k in after}
    assert kept == {k: after[k] for k in kept}, "a recorded trial was run again"
    # only trials made by weights newer than the resumed checkpoint may have moved aside
    moved = set(before) - set(after)
    assert all((path / "trials" / "discarded" / m).exists() for m in moved)
