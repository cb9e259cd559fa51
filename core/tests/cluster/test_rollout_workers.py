"""Rollout workers as Ray actors on the simulated cluster (slr.cluster.workers).

The workers build the run's backend (``local``), agent (the model-free ``oracle``, so no
engine is needed here) and verifier (``harbor``) in their own processes on the ``sandbox``
node; the driver's pool hands them trials and alone records them. The last tests kill a
worker mid-trial with ``ray.kill``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

import pytest

from slr.cluster.workers import RolloutPool, retry_id, start_rollout_workers
from slr.config import load_config
from slr.contracts import TerminationReason
from slr.plugins import get_plugin_manager
from slr.rollout.recorder import TrialRecorder, TrialSpec
from slr.run.directory import RunDir
from slr.tasks import load_task

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """hello-world, and a copy whose solution takes a few seconds (a trial long enough to
    be in flight when its worker is killed)."""
    root = tmp_path_factory.mktemp("tasks")
    shutil.copytree(EXAMPLES / "hello-world", root / "hello-world")
    slow = root / "slow-hello"
    shutil.copytree(EXAMPLES / "hello-world", slow)
    toml = (slow / "task.toml").read_text().replace("slr/hello-world", "slr/slow-hello")
    (slow / "task.toml").write_text(toml)
    solve = (slow / "solution" / "solve.sh").read_text()
    (slow / "solution" / "solve.sh").write_text(solve.replace("\n", "\nsleep 4\n", 1))
    return {"hello": load_task(root / "hello-world"), "slow": load_task(slow), "root": root}


def worker_config(tmp: Path, root: Path, workers: int = 2, pool_size: int = 0, resources=None):
    data = {
        "run": {
            "runs_dir": str(tmp / "runs"),
            "rollout_workers": workers,
            "worker_resources": {"sandbox": 1} if resources is None else resources,
        },
        "tasks": {"path": str(root)},
        "rollout": {"concurrency": 4, "pool_size": pool_size},
        "agent": {"name": "oracle"},
        "backend": {"name": "local", "workspace_dir": str(tmp / "ws")},
    }
    return load_config(
        data=data, plugins=get_plugin_manager(), only_plugins=("agent", "backend", "verifier")
    )


@contextlib.contextmanager
def started_pool(tmp: Path, tasks, *, pool_size: int = 0, resources=None):
    """A run directory, the driver's session (no proxy, no sandboxes) and two workers."""
    config = worker_config(tmp, tasks["root"], pool_size=pool_size, resources=resources)
    run = RunDir.create(config.run.runs_dir, "workers", config.to_toml())
    loop = asyncio.new_event_loop()
    agent = get_plugin_manager().get("agent", "oracle").create()
    session = TrialRecorder(
        run, plugins=get_plugin_manager(), config=config, agent=agent, serve_proxy=False
    )
    loop.run_until_complete(session.__aenter__())
    pool = loop.run_until_complete(
        start_rollout_workers(config, session, replicas=[], tasks=[tasks["hello"], tasks["slow"]])
    )
    try:
        yield loop, pool, session, run
    finally:
        loop.run_until_complete(pool.close())
        loop.run_until_complete(session.__aexit__(None, None, None))
        loop.close()
        run.close()


@pytest.fixture(scope="module")
def pool_and_session(ray_cluster, tasks, tmp_path_factory):
    with started_pool(tmp_path_factory.mktemp("workers"), tasks) as started:
        yield started


def test_workers_run_on_the_sandbox_node_and_the_driver_records(
    pool_and_session, ray_cluster, tasks
):
    loop, pool, _, run = pool_and_session
    assert isinstance(pool, RolloutPool) and len(pool.live()) == 2
    assert {w.node_id for w in pool.workers} == set(ray_cluster.node_ids("sandbox"))
    assert all(w.pid != os.getpid() for w in pool.workers)
    specs = [
        TrialSpec(task=tasks["hello"], trial_id=f"w-hello-{k}", group_id="w-hello", step=1)
        for k in range(4)
    ]
    results = loop.run_until_complete(pool.run(specs))
    assert [r.trial_id for r in results] == [s.trial_id for s in specs]
    for r in results:
        assert r.termination == TerminationReason.COMPLETED, r.error
        assert r.reward is not None and r.reward.value == 1.0
        # recorded by the driver, once, as the in-process session records
        assert run.trial(r.trial_id) == r
    # both workers took trials (least-loaded placement with 4 at once over 2 workers)
    assert pool.metrics()["workers/live"] == 2
    # asking again reads the records back: nothing runs twice
    again = loop.run_until_complete(pool.run_one(specs[0]))
    assert again == results[0]


def test_a_bad_worker_resource_fails_at_once_naming_it(pool_and_session, tasks, tmp_path):
    import attrs

    from slr.errors import UsageError

    loop, _, session, _ = pool_and_session
    config = worker_config(tmp_path, tasks["root"], workers=3)
    config = attrs.evolve(config, run=attrs.evolve(config.run, worker_resources={"sandbox": 1}))
    with pytest.raises(UsageError) as info:
        loop.run_until_complete(start_rollout_workers(config, session, replicas=[], tasks=[]))
    message = str(info.value)
    assert "run.worker_resources asks sandbox = 1" in message and "rollout_workers" in message


def test_a_cancelled_trial_is_not_recorded_and_its_worker_stays(pool_and_session, tasks):
    loop, pool, _, run = pool_and_session
    spec = TrialSpec(task=tasks["slow"], trial_id="w-cancel-0", group_id="w-cancel")

    async def scenario():
        running = asyncio.ensure_future(pool.run_one(spec))
        await asyncio.sleep(0)  # one turn: the pool has sent the spec to a worker
        assert sum(w.load for w in pool.workers) == 1
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    loop.run_until_complete(scenario())
    assert not run.has_trial("w-cancel-0")  # as in the driver: a cancelled trial is not recorded
    assert len(pool.live()) == 2 and all(w.load == 0 for w in pool.workers)


def test_a_worker_killed_mid_trial_is_an_infrastructure_failure_and_the_trial_reruns(
    pool_and_session, tasks
):
    import ray

    loop, pool, _, run = pool_and_session
    spec = TrialSpec(task=tasks["slow"], trial_id="w-slow-0", group_id="w-slow", step=2)

    async def scenario():
        running = asyncio.ensure_future(pool.run_one(spec))
        await asyncio.sleep(0)  # one turn: the pool has sent the spec to a worker
        (victim,) = [w for w in pool.workers if w.load == 1]
        ray.kill(victim.actor, no_restart=True)
        return victim, await running

    victim, result = loop.run_until_complete(scenario())
    lost = run.trial("w-slow-0")
    assert lost.termination == TerminationReason.WORKER_LOST
    assert not lost.trainable and lost.reward is None  # excluded from the loss, never 0
    assert victim.name in (lost.error or "")
    # re-queued under a new id, on the worker that is left, and it earned its reward
    assert result.trial_id == retry_id("w-slow-0", 1) == "w-slow-0-r1"
    assert result.termination == TerminationReason.COMPLETED and result.reward is not None
    assert result.reward.value == 1.0 and result.group_id == "w-slow"
    assert run.trial("w-slow-0-r1") == result
    assert pool.metrics() == {"workers/live": 1, "workers/lost": 1, "trials/worker_lost": 1}
    assert any(e["event"] == "worker_lost" for e in run.events())
    # the run goes on with the remaining worker
    more = loop.run_until_complete(
        pool.run_one(TrialSpec(task=tasks["hello"], trial_id="w-after-0", group_id="w-after"))
    )
    assert more.reward is not None and more.reward.value == 1.0
    # a resumed run finds the retry recorded: it runs nothing again
    before = set(run.trial_ids())
    assert loop.run_until_complete(pool.run_one(spec)) == result
    assert set(run.trial_ids()) == before


def test_announced_trials_take_warm_sandboxes_on_the_workers_told_of_them(
    ray_cluster, tasks, tmp_path
):
    """``[rollout] pool_size`` with rollout workers: the trials a loop announces are placed
    on the workers at once, each worker's pool starts their sandboxes, and each trial then
    runs where its sandbox is warm. A trial nobody announced starts its sandbox cold.
    (No ``sandbox`` resource asked: the module's two workers hold the node's two.)"""
    with started_pool(tmp_path, tasks, pool_size=2, resources={}) as (loop, pool, _, run):
        specs = [
            TrialSpec(task=tasks["hello"], trial_id=f"p-hello-{k}", group_id="p-hello", step=1)
            for k in range(4)
        ]

        async def announce():  # as the loops do: from inside the running event loop
            pool.expect(specs)

        loop.run_until_complete(announce())
        assert sorted(w.placed for w in pool.workers) == [2, 2]  # balanced, before any runs
        results = loop.run_until_complete(pool.run(specs))
        for r in results:
            assert r.termination == TerminationReason.COMPLETED, r.error
            assert r.reward is not None and r.reward.value == 1.0
            assert r.costs is not None and r.costs.pool_start_s is not None, r.trial_id
            assert run.trial(r.trial_id) == r
        assert all(w.placed == 0 for w in pool.workers)
        cold = loop.run_until_complete(
            pool.run_one(TrialSpec(task=tasks["hello"], trial_id="p-cold", group_id="p-cold"))
        )
        assert cold.costs is not None and cold.costs.pool_start_s is None
        assert cold.reward is not None and cold.reward.value == 1.0


def test_an_async_resume_counts_the_retry_in_place_of_the_lost_trial(tasks, tmp_path):
    """The async loop's resume groups finished trials by group: a ``worker_lost`` record
    is not one of them, its retry is (so the group is complete and is not run again)."""
    import attrs

    from slr.contracts import Reward, TrialResult
    from slr.run.async_loop import AsyncLoop, group_specs

    config = worker_config(tmp_path, tasks["root"])
    config = attrs.evolve(config, rollout=attrs.evolve(config.rollout, n_per_task=2))
    run = RunDir.create(config.run.runs_dir, "resume", config.to_toml())
    loop = AsyncLoop.__new__(AsyncLoop)  # no components: only the resume bookkeeping
    loop.config, loop.run, loop.tasks = config, run, [tasks["hello"]]
    loop.trained, loop._recovered = set(), []
    a, b = group_specs(loop.tasks, seed=0, seq=0, n=2)

    def done(trial_id: str, **kw) -> TrialResult:
        return TrialResult(
            trial_id=trial_id, task_id="hello-world", group_id=a.group_id, weights_version=0, **kw
        )

    run.write_trial(done(a.trial_id, termination=TerminationReason.WORKER_LOST))
    run.write_trial(done(retry_id(a.trial_id, 1), termination="completed", reward=Reward(value=1)))
    run.write_trial(done(b.trial_id, termination="completed", reward=Reward(value=0)))
    loop._discard_after(0)
    (group,) = loop._recovered
    assert sorted(t.trial_id for t in group.trials) == sorted([retry_id(a.trial_id, 1), b.trial_id])
    run.close()
