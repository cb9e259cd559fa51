"""The asynchronous loop (``run.mode = "async"``): staleness admission, dynamic sampling,
deterministic group ids, and resume after a real SIGKILL.

Real pieces throughout: the local backend, the embedded hf engine and torch optimizer on a
tiny random model. The staleness test's agent makes one real model call through the proxy
(so trained trials carry per-token weight versions) and then runs the task's solution;
the others use the model-free ``oracle`` (the loop's bookkeeping is what is under test).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from slr import checkpoints, hookimpl
from slr.agents.model_free import OracleAgent
from slr.async_loop import async_group_id, group_seq, group_specs, task_of_group, token_versions
from slr.config import load_config
from slr.contracts import AgentOutcome
from slr.plugins import get_plugin_manager
from slr.runs import RunDir
from slr.tasks import load_tasks
from slr.training import train

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
INCLUDE = ["hello-world", "make-directory"]
SLR = str(Path(sys.executable).with_name("slr"))


class CallingOracle(OracleAgent):
    """One real model call through the proxy (tokens to train on), then the solution."""

    needs_model = True

    async def run(self, sandbox, instruction, endpoint, *, timeout_s, task=None) -> AgentOutcome:
        async with httpx.AsyncClient(timeout=120) as client:
            reply = await client.post(
                f"{endpoint.base_url}/chat/completions",
                headers={"Authorization": f"Bearer {endpoint.api_key}"},
                json={"model": endpoint.model, "messages": [{"role": "user", "content": "hi"}]},
            )
            reply.raise_for_status()
        return await super().run(sandbox, instruction, endpoint, timeout_s=timeout_s, task=task)


class CallingOraclePlugin:
    @hookimpl
    def register_agents(self, register):
        register("calling-oracle", CallingOracle)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    from slr_engine_hf import tiny

    model, tok = tiny.tiny_model(hidden=32, layers=1)
    return tiny.save(model, tok, tmp_path_factory.mktemp("tiny") / "model")


def data(tmp_path: Path, model: Path, *, steps: int, agent: str = "oracle", **rollout) -> dict:
    return {
        "run": {
            "name": "async",
            "runs_dir": str(tmp_path / "runs"),
            "steps": steps,
            "mode": "async",
        },
        "tasks": {"path": str(TASKS), "include": INCLUDE},
        "rollout": {
            "tasks_per_step": 2,
            "n_per_task": 2,
            "concurrency": 2,
            "max_tokens": 8,
            **rollout,
        },
        "agent": {"name": agent},
        "backend": {"name": "local"},
        "engine": {"name": "hf", "model": str(model)},
    }


def trained_per_step(run: RunDir, steps: int) -> dict[int, set[str]]:
    """The groups each step trained on, from the checkpoints' cumulative lists."""
    out, before = {}, set()
    for s in range(1, steps + 1):
        now = set(checkpoints.read_state(checkpoints.checkpoint_dir(run, s)).trained_groups)
        assert before <= now, "a checkpoint forgot a trained group"
        out[s], before = now - before, now
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


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("k", [0, 1])
def test_staleness_bound_on_the_recorded_token_versions(tmp_path, tiny_model_dir, slr_plugins, k):
    slr_plugins.register(CallingOraclePlugin(), name="calling-oracle")
    steps = 3
    cfg = load_config(
        data=data(
            tmp_path,
            tiny_model_dir,
            steps=steps,
            agent="calling-oracle",
            max_staleness=k,
            concurrency=4,
        ),
        plugins=get_plugin_manager(),
    )
    run = train(cfg)
    trials = {t.group_id: [] for t in run.trials()}
    for t in run.trials():
        trials[t.group_id].append(t)
    for step, groups in trained_per_step(run, steps).items():
        assert len(groups) == 2
        versions = [v for g in groups for t in trials[g] for v in token_versions(t)]
        assert versions and all(step - 1 - k <= v <= step - 1 for v in versions), (step, versions)
        if k == 0:  # on-policy: generated by exactly the weights being updated
            assert set(versions) == {step - 1}
    metrics = run.metrics()
    assert all(m["staleness/age_max"] <= k and m["groups/dropped_stale"] == 0 for m in metrics)
    if k == 0:
        # admission blocked the starts instead of throwing work away: every group that
        # started was trained, none more
        assert sum(m["groups/started"] for m in metrics) == 2 * steps
        assert len(trials) == 2 * steps


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dynamic_sampling_replaces_groups_without_signal(tmp_path, tiny_model_dir):
    # the oracle passes every trial: every group's rewards are all equal (no signal)
    cfg = load_config(
        data=data(
            tmp_path,
            tiny_model_dir,
            steps=2,
            max_staleness=0,
            dynamic_sampling=True,
            max_oversample=1,
        ),
        plugins=get_plugin_manager(),
    )
    run = train(cfg)
    metrics = run.metrics()
    assert [m["groups/dropped_no_signal"] for m in metrics] == [1, 1]
    assert [m["groups/trained"] for m in metrics] == [2, 2]
    assert [m["groups/started"] for m in metrics] == [3, 3]
    groups = Counter(t.group_id for t in run.trials())
    assert len(groups) == 6 and set(groups.values()) == {2}


def write_config(path: Path, model: Path, *, steps: int) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(data(path.parent, model, steps=steps, max_staleness=1)))
    return path


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigkill_then_resume_trains_no_group_twice(tmp_path, tiny_model_dir):
    steps = 4
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
        return done and len(list(path.glob("trials/g*.json"))) > 4

    deadline = time.monotonic() + 200
    while not reached():
        assert proc.poll() is None, "the run ended before the kill"
        assert time.monotonic() < deadline, "the run never got past step 1"
        time.sleep(0.005)  # polling a file, not synchronising on time
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
    assert len(trained) == len(set(trained)) == 2 * steps, "a group was trained twice"
    after = {p.name: p.read_bytes() for p in (path / "trials").glob("*.json")}
    kept = {k: v for k, v in before.items() if k in after}
    assert kept == {k: after[k] for k in kept}, "a recorded trial was run again"
    # only trials made by weights newer than the resumed checkpoint may have moved aside
    moved = set(before) - set(after)
    assert all((path / "trials" / "discarded" / m).exists() for m in moved)
