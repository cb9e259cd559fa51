"""The trial recorder on the real local backend: each trial recorded exactly once, on every
path (a run, a repeat of recorded specs, cancellation, resume, eval, serve), and every part
closed on every path."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend
from slr_verifier_harbor.verifier import HarborVerifier

from slr import hookimpl
from slr.agents.model_free import NopAgent, OracleAgent
from slr.config import Config, load_config
from slr.contracts import AgentOutcome
from slr.plugins import get_plugin_manager
from slr.rollout.recorder import TrialRecorder, TrialSpec
from slr.run.directory import RunDir
from slr.sandboxing.pool import SandboxPool
from slr.tasks import load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


class TrialCounter:
    """Counts ``on_trial_finished`` per trial id."""

    def __init__(self):
        self.calls: Counter[str] = Counter()

    @hookimpl
    def on_trial_finished(self, run_dir, trial):
        self.calls[trial.trial_id] += 1


class ClosingSpy:
    """The real local backend, counting ``close`` calls."""

    def __init__(self, root: Path):
        self.inner = LocalBackend(
            LocalBackendConfig(
                isolation="bubblewrap",
                workspace_dir=str(root / "ws"),
                cache_dir=str(root / "cache"),
            )
        )
        self.closed = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def close(self):
        self.closed += 1
        await self.inner.close()


@pytest.fixture
def counter(slr_plugins):
    c = TrialCounter()
    slr_plugins.register(c, name="trial-counter")
    return c


def config(**sections) -> Config:
    data = {
        "agent": {"name": "oracle"},
        "backend": {"name": "local"},
        "tasks": {"path": str(EXAMPLES), "include": ["hello-world"]},
        "rollout": {"concurrency": 2},
        **sections,
    }
    return load_config(data=data, plugins=get_plugin_manager(), only_plugins=("agent", "backend"))


def specs(n: int) -> list[TrialSpec]:
    task = load_task(EXAMPLES / "hello-world")
    return [TrialSpec(task=task, trial_id=f"t{i}", group_id="g", step=1) for i in range(n)]


def session(run, plugins, backend, agent=None, concurrency=2) -> TrialRecorder:
    return TrialRecorder(
        run,
        plugins=plugins.manager,
        config=config(rollout={"concurrency": concurrency}),
        backend=backend,
        agent=agent or OracleAgent(),
        verifier=HarborVerifier(),
        tasks=[s.task for s in specs(1)],
    )


def recorded_files(run: RunDir) -> Counter[str]:
    return Counter(p.stem for p in (run.path / "trials").glob("*.json"))


def test_each_trial_is_recorded_once_and_a_recorded_spec_is_not_run_again(
    tmp_path, slr_plugins, counter
):
    run = RunDir.create(tmp_path / "runs", "r", "")
    backend = ClosingSpy(tmp_path)

    async def go():
        async with session(run, slr_plugins, backend) as s:
            first = await s.run(specs(3))
            again = await s.run(specs(3))  # all recorded: read back, nothing re-run
            return first, again

    first, again = asyncio.run(go())
    assert [r.trial_id for r in first] == ["t0", "t1", "t2"]
    assert again == first and all(r.reward.value == 1.0 for r in first)
    assert counter.calls == recorded_files(run) == Counter({"t0": 1, "t1": 1, "t2": 1})
    assert first[0].group_id == "g" and first[0].step == 1 and first[0].weights_version is None
    assert backend.closed == 1


def test_expect_warms_the_pool_for_announced_trials_that_have_no_record(tmp_path, slr_plugins):
    run = RunDir.create(tmp_path / "runs", "r", "")
    backend = ClosingSpy(tmp_path)
    s = TrialRecorder(
        run,
        plugins=slr_plugins.manager,
        config=config(rollout={"concurrency": 2, "pool_size": 2}),
        backend=backend,
        agent=OracleAgent(),
        verifier=HarborVerifier(),
        tasks=[specs(1)[0].task],
    )

    async def go():
        async with s:
            pool = s.backend
            assert isinstance(pool, SandboxPool)
            await s.run_one(specs(1)[0])  # t0 is recorded
            s.expect(specs(1))  # only t0: read back, not run, so nothing to warm
            idle = pool.warm
            s.expect(specs(2))  # t0 and t1: one sandbox, for t1
            warm = pool.warm
            await pool.wait_ready()
            return idle, warm

    assert asyncio.run(go()) == (0, 1)
    # leaving the session stopped t1's sandbox, which no trial took, and closed the backend
    assert backend.closed == 1 and not any((tmp_path / "ws").iterdir())


class PrestartingOracle(OracleAgent):
    """The oracle, with a ``prestart`` that leaves a token in each pooled sandbox."""

    def __init__(self) -> None:
        super().__init__()
        self.prestarted: list[str] = []
        self.seen: list[tuple[str, object]] = []

    async def prestart(self, sandbox):
        self.prestarted.append(sandbox.id)
        return f"ahead-{sandbox.id}"

    async def run(self, sandbox, instruction, endpoint, *, timeout_s, task):
        self.seen.append((sandbox.id, getattr(sandbox, "prestarted", None)))
        return await super().run(sandbox, instruction, endpoint, timeout_s=timeout_s, task=task)


def test_the_pool_runs_the_agents_prestart_and_the_trial_gets_what_it_left(tmp_path, slr_plugins):
    run = RunDir.create(tmp_path / "runs", "r", "")
    agent = PrestartingOracle()
    s = TrialRecorder(
        run,
        plugins=slr_plugins.manager,
        config=config(rollout={"concurrency": 1, "pool_size": 1}),
        backend=ClosingSpy(tmp_path),
        agent=agent,
        verifier=HarborVerifier(),
        tasks=[specs(1)[0].task],
    )

    async def go():
        async with s:
            return await s.run(specs(2))

    results = asyncio.run(go())
    assert [r.reward and r.reward.value for r in results] == [1.0, 1.0]
    assert len(agent.seen) == 2 and agent.prestarted
    for sandbox_id, token in agent.seen:  # each trial: its own sandbox's, when pooled
        assert token in (None, f"ahead-{sandbox_id}")
    assert any(token is not None for _, token in agent.seen)


def test_duplicate_ids_are_refused_before_anything_runs(tmp_path, slr_plugins, counter):
    run = RunDir.create(tmp_path / "runs", "r", "")

    async def go():
        async with session(run, slr_plugins, ClosingSpy(tmp_path)) as s:
            await s.run([*specs(2), *specs(1)])

    with pytest.raises(ValueError, match=r"given twice: \['t0'\]"):
        asyncio.run(go())
    assert not counter.calls and not recorded_files(run)


class _BlocksOnSecond(NopAgent):
    """Finishes the first trial at once; the second calls ``on_block`` and waits forever."""

    def __init__(self, on_block):
        self.runs, self.on_block = 0, on_block

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        self.runs += 1
        if self.runs > 1:
            self.on_block()
            await asyncio.Event().wait()
        return AgentOutcome(exit_code=0)


@pytest.mark.timeout(120)
def test_cancellation_records_only_finished_trials_and_resume_runs_the_rest(tmp_path, slr_plugins):
    run = RunDir.create(tmp_path / "runs", "r", "")
    backend = ClosingSpy(tmp_path)

    async def cancelled():
        main = asyncio.current_task()
        counter = TrialCounter()
        slr_plugins.register(counter, name="before")
        # one trial at a time: t0 ends and is recorded; t1's agent phase is under way when
        # the whole session is cancelled, as Ctrl-C does; t2 never starts
        agent = _BlocksOnSecond(on_block=main.cancel)
        with pytest.raises(asyncio.CancelledError):
            async with session(run, slr_plugins, backend, agent=agent, concurrency=1) as s:
                await s.run(specs(3))
        slr_plugins.manager.unregister_plugin("before")
        return counter

    before = asyncio.run(cancelled())
    assert backend.closed == 1, "a cancelled session still closes the backend"
    assert before.calls == recorded_files(run) == Counter({"t0": 1})
    assert list(backend.inner.workspace_dir.iterdir()) == [], "a sandbox outlived the cancel"

    after = TrialCounter()
    slr_plugins.register(after, name="after")

    async def resumed():
        async with session(RunDir.open(run.path), slr_plugins, backend) as s:
            return await s.run(specs(3))

    results = asyncio.run(resumed())
    assert [r.trial_id for r in results] == ["t0", "t1", "t2"]
    assert before.calls + after.calls == Counter({"t0": 1, "t1": 1, "t2": 1})
    assert recorded_files(run) == Counter({"t0": 1, "t1": 1, "t2": 1})


class _PrepareFails(ClosingSpy):
    async def prepare(self, task):
        raise RuntimeError("prepare failed")


@pytest.mark.parametrize("where", ["entering", "in the body"])
def test_the_backend_is_closed_when_the_session_fails(tmp_path, slr_plugins, where):
    run = RunDir.create(tmp_path / "runs", "r", "")
    backend = (_PrepareFails if where == "entering" else ClosingSpy)(tmp_path)

    async def go():
        async with session(run, slr_plugins, backend):
            raise RuntimeError("body failed")

    with pytest.raises(RuntimeError, match="prepare failed" if where == "entering" else "body"):
        asyncio.run(go())
    assert backend.closed == 1


def test_an_eval_records_each_trial_once_and_its_resume_adds_none(tmp_path, counter):
    from slr.run.evaluation import Evaluation

    out = tmp_path / "eval"
    Evaluation(config(), samples=2, output=out).main()
    ids = Counter({"hello-world-0": 1, "hello-world-1": 1})
    assert counter.calls == recorded_files(RunDir(out)) == ids
    Evaluation.resume(out).main()
    assert counter.calls == ids


@pytest.mark.slow
def test_a_served_session_is_recorded_once_without_reward(tmp_path, counter):
    """`slr serve`'s path: a session opened by hand, used by a real client, recorded."""
    import openai
    from slr_engine_hf.engine import HfEngine

    from slr_testkit.tiny import save, tiny_model

    folder = save(*tiny_model(hidden=32, layers=1), tmp_path / "model")
    run = RunDir.create(tmp_path / "runs", "serve", "")
    engine = HfEngine.from_folder(folder)
    closed = []
    real_close = engine.close

    async def close():
        closed.append(True)
        await real_close()

    engine.close = close

    async def go():
        async with TrialRecorder(
            run,
            plugins=get_plugin_manager(),
            config=config(rollout={"max_tokens": 4}),
            engine=engine,
        ) as s:
            opened = s.open_session("session-0")
            client = openai.AsyncOpenAI(
                base_url=opened.openai_base_url, api_key=opened.token, max_retries=0
            )
            reply = await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "Hi"}]
            )
            return reply, await s.close_session(opened)

    reply, result = asyncio.run(go())
    assert result.reward is None and result.task_id == "serve"
    assert sum(result.trajectory.segments[0].loss_mask) == reply.usage.completion_tokens
    assert counter.calls == recorded_files(run) == Counter({"session-0": 1})
    assert run.trial("session-0") == result
    assert (run.path / "trials" / "session-0" / "proxy.json").is_file()
    assert closed == [True], "the session closes the engine it was given"


@pytest.mark.timeout(60)
def test_trials_are_recorded_off_the_event_loop(tmp_path, slr_plugins):
    """The proxy serving other trials shares the loop: a long record's write must not stall it."""
    run = RunDir.create(tmp_path / "runs", "r", "")
    writers: list[threading.Thread] = []
    write = run.write_trial

    def spy(trial):
        writers.append(threading.current_thread())
        return write(trial)

    run.write_trial = spy  # type: ignore[method-assign]

    async def go():
        async with session(run, slr_plugins, ClosingSpy(tmp_path)) as s:
            await s.run(specs(1))
        return threading.current_thread()

    loop_thread = asyncio.run(go())
    assert len(writers) == 1 and writers[0] is not loop_thread
