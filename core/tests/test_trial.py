"""The trial runner on the real local backend (bubblewrap): every way a trial can end."""

from __future__ import annotations

import asyncio
import shutil
import textwrap
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend
from slr_verifier_harbor.verifier import HarborVerifier

from slr.agents.model_free import NopAgent, OracleAgent
from slr.contracts import AgentOutcome, Bundle, TerminationReason, TrialResult
from slr.rollout.trial import StandInSessions, run_trial
from slr.run.directory import RunDir
from slr.sandboxing import labels as labels_mod
from slr.tasks import load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
T = TerminationReason


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("trial-backend")
    b = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap", workspace_dir=str(root / "ws"), cache_dir=str(root / "cache")
        )
    )
    yield b
    ws = root / "ws"
    assert not ws.exists() or list(ws.iterdir()) == [], "a trial left its workspace behind"


def make_task(tmp_path, *, test_sh: str, solve_sh: str = "true", toml: str = "") -> object:
    d = tmp_path / "task"
    shutil.copytree(EXAMPLES / "hello-world", d)
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + textwrap.dedent(solve_sh))
    if toml:
        (d / "task.toml").write_text(toml)
    return load_task(d)


def trial(backend, task, agent=None, **kw) -> TrialResult:
    return asyncio.run(
        run_trial(
            task,
            backend=backend,
            agent=agent or OracleAgent(),
            verifier=HarborVerifier(),
            session_factory=kw.pop("sessions", StandInSessions()),
            **kw,
        )
    )


def test_verifier_timeout_is_not_a_zero(backend, tmp_path):
    task = make_task(tmp_path, test_sh="sleep 30\n", toml="[verifier]\ntimeout_sec = 1\n")
    r = trial(backend, task)
    assert r.termination == T.VERIFIER_TIMEOUT and r.reward is None and not r.trainable
    assert "verifier.timeout_sec = 1s" in r.error


def test_missing_reward_is_a_verifier_error(backend, tmp_path):
    task = make_task(tmp_path, test_sh="echo oops >&2; exit 2\n")
    r = trial(backend, task)
    assert r.termination == T.VERIFIER_ERROR and r.reward is None and not r.trainable
    assert "reward.txt or reward.json" in r.error and "oops" in r.error


def test_reward_json_scalar_and_details(backend, tmp_path):
    task = make_task(
        tmp_path,
        test_sh="""\
        mkdir -p /logs/verifier
        echo '{"reward": 0.75, "passed": 3, "total": 4}' > /logs/verifier/reward.json
        """,
    )
    r = trial(backend, task)
    assert r.termination == T.COMPLETED and r.reward.value == 0.75
    assert r.reward.details["rewards"] == {"reward": 0.75, "passed": 3.0, "total": 4.0}


def test_agent_timeout_still_verifies(backend, tmp_path):
    task = make_task(
        tmp_path,
        solve_sh="echo hello > /app/hello.txt; sleep 30\n",
        test_sh="mkdir -p /logs/verifier; [ -f /app/hello.txt ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
        toml="[agent]\ntimeout_sec = 1\n",
    )
    r = trial(backend, task)
    assert r.termination == T.AGENT_TIMEOUT and r.trainable
    assert r.reward.value == 1.0  # what the agent did before the timeout counts
    assert r.timings["agent_s"] < 20


class _Raises(NopAgent):
    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        raise RuntimeError("scaffold crashed")


def test_agent_error_is_recorded_with_the_reward(backend):
    r = trial(backend, load_task(EXAMPLES / "hello-world"), agent=_Raises())
    assert r.termination == T.AGENT_ERROR and "scaffold crashed" in r.error
    assert r.reward.value == 0.0


class _Forger(NopAgent):
    """Plants a reward and a fake test script where the verifier will look."""

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        await sandbox.exec(
            "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
            "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh"
        )
        return AgentOutcome(exit_code=0)


def test_planted_reward_and_tests_are_wiped_before_verification(backend):
    r = trial(backend, load_task(EXAMPLES / "hello-world"), agent=_Forger())
    assert r.termination == T.COMPLETED and r.reward.value == 0.0


class _LabelSpy:
    """The real backend, remembering the labels each sandbox was started with."""

    def __init__(self, inner):
        self.inner, self.labels = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def start(self, task, *, trial_id, labels, **kw):
        self.labels.append(dict(labels))
        return await self.inner.start(task, trial_id=trial_id, labels=labels, **kw)


def test_the_trial_writes_nothing_and_labels_its_sandbox(backend, tmp_path):
    spy = _LabelSpy(backend)
    r = trial(
        spy,
        load_task(EXAMPLES / "hello-world"),
        trial_id="t-1",
        run_id="run-7",
        labels={"team": "a", labels_mod.TRIAL: "spoofed"},
        group_id="g1",
        step=3,
    )
    assert r.group_id == "g1" and r.step == 3 and r.reward.value == 1.0 and r.agent is None
    assert spy.labels == [
        {"team": "a", "slr.run_id": "run-7", "slr.trial_id": "t-1", "slr.task_id": "hello-world"}
    ]
    # recording is the trial recorder's job (core/tests/test_rollout.py), not the runner's
    assert not any(tmp_path.iterdir())


class _Blocks(NopAgent):
    def __init__(self):
        self.started = asyncio.Event()

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        self.started.set()
        await sandbox.exec("sleep 600")
        return AgentOutcome(exit_code=0)


# Once hung in about half the runs: the cancel landed while asyncio was spawning bwrap, and
# bwrap's sandbox init outlived asyncio's kill holding the exec's pipes (see the local
# backend's sandbox.py). The timeout turns any return of it into a failure, not a CI stall.
@pytest.mark.timeout(90)
def test_cancellation_cleans_up_and_propagates(backend):
    agent = _Blocks()

    async def go():
        t = asyncio.ensure_future(
            run_trial(
                load_task(EXAMPLES / "hello-world"),
                backend=backend,
                agent=agent,
                verifier=HarborVerifier(),
                session_factory=StandInSessions(),
            )
        )
        await agent.started.wait()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(go())
    assert list(backend.workspace_dir.iterdir()) == []


class _BrokenSessions(StandInSessions):
    async def open(self, trial_id):
        raise ConnectionError("proxy down")


def test_a_failing_session_factory_ends_the_trial_cleanly(backend):
    r = trial(backend, load_task(EXAMPLES / "hello-world"), sessions=_BrokenSessions())
    assert r.termination == T.ENGINE_ERROR and "proxy down" in r.error and not r.trainable


class _Bundled(NopAgent):
    def __init__(self, path):
        self.path = path

    def bundle(self):
        return Bundle(path=self.path, version="1")

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        res = await sandbox.exec("cat /opt/slr/agent/tool.txt; touch /opt/slr/agent/x 2>&1")
        self.out = res.stdout
        return AgentOutcome(exit_code=0)


def test_the_agent_bundle_is_mounted_read_only(backend, tmp_path):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "tool.txt").write_text("tool-v1\n")
    agent = _Bundled(tmp_path / "bundle")
    r = trial(backend, load_task(EXAMPLES / "hello-world"), agent=agent)
    assert "tool-v1" in agent.out and "Read-only file system" in agent.out
    # the bundle's version is the trial's agent_version, and survives the run directory
    assert r.agent_version == "1"
    run = RunDir.create(tmp_path / "runs", "v", "")
    run.write_trial(r)
    assert [t.agent_version for t in run.trials()] == ["1"]


def test_capture_diff_keeps_every_kind_of_change_and_the_history_is_restored_after(
    backend, tmp_path
):
    d = tmp_path / "median"
    shutil.copytree(EXAMPLES / "fix-median", d)
    # the verifier sees the original history again (2 commits from make-history.sh), not
    # the one-commit snapshot the diff was taken against
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "git -c safe.directory='*' -C /app rev-list --count HEAD > /logs/verifier/reward.txt\n"
    )
    (d / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -e\ncd /app\nrm README.md\necho 'x = 1' > stats/new.py\n"
        "printf 'print(1)\\n' >> stats/core.py\npython3 -c 'import stats.core'\n"
    )
    task = load_task(d)
    r = trial(backend, task, capture_diff=True)
    assert r.termination == T.COMPLETED, r.error
    assert r.reward is not None and r.reward.value > 1, "history not restored for the verifier"
    diff = r.diff or ""
    assert "deleted file mode" in diff and "--- a/README.md" in diff
    assert "new file mode" in diff and "+++ b/stats/new.py" in diff and "+x = 1" in diff
    assert "+print(1)" in diff
    assert "__pycache__" not in diff  # importing the package wrote byte-code
    assert trial(backend, task).diff is None  # off by default
