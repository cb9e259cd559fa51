"""The docker backend on the real daemon: conformance suite, image cache, failures, orphans.

Needs dockerd and the base image (`slr images base`); CI provides both. A missing daemon
fails these tests; it does not skip them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from slr_backend_docker import DockerBackendConfig
from slr_backend_docker.backend import DockerBackend, daemon_is_local
from slr_backend_docker.base_image import BASE_TAG

from slr.contracts import AgentAdapter, AgentOutcome, Bundle, SandboxError, TerminationReason
from slr.plugins import get_plugin_manager
from slr.rollout.trial import StandInSessions, run_trial, run_trials
from slr.sandboxing.labels import OWNER_HOST, OWNER_PID, RUN, SANDBOX, TASK, TRIAL
from slr.tasks import load_task
from slr_testkit import SandboxBackendTests
from slr_testkit.sandbox_probes import probe_connect

pytestmark = pytest.mark.docker

TEST_LABEL = "slr.test"


@pytest.fixture(scope="session")
def backend():
    b = DockerBackend(DockerBackendConfig())
    assert b.client.images.get(BASE_TAG), f"run `slr images base` first ({BASE_TAG})"
    yield b
    leftovers = [
        c.name
        for c in b.client.containers.list(all=True, filters={"label": SANDBOX})
        if c.labels.get(OWNER_PID) == str(os.getpid())
    ]
    asyncio.run(b.close())
    assert leftovers == [], f"containers left behind: {leftovers}"


@pytest.fixture(scope="session")
def decoy(backend):
    """A container of our own on docker's default bridge, listening on 8000."""
    c = backend.client.containers.run(
        BASE_TAG,
        ["python3", "-m", "http.server", "8000", "--bind", "0.0.0.0"],
        detach=True,
        labels={TEST_LABEL: "decoy"},
        network_mode="bridge",
    )
    try:
        # Ready when the server answers on its port (checked from inside the decoy itself).
        c.exec_run(["python3", "-c", _WAIT_FOR_PORT, "8000"])
        c.reload()
        yield c
    finally:
        c.remove(force=True)


_WAIT_FOR_PORT = """
import socket, sys, time
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
"""


class TestDockerConformance(SandboxBackendTests):
    @pytest.fixture
    def unreachable_hosts(self, backend, decoy):
        net = decoy.attrs["NetworkSettings"]
        # the loopback, this machine as seen from docker's bridge, a container on the bridge
        return ["127.0.0.1", net["Gateway"], f"{net['IPAddress']}:8000"]


def _run(coro):
    return asyncio.run(coro)


def _copy_task(src, dst, dockerfile: str | None = None):
    shutil.copytree(src.path, dst)
    if dockerfile is not None:
        (dst / "environment" / "Dockerfile").write_text(dockerfile)
    return load_task(dst)


def test_unchanged_task_is_not_rebuilt_and_changed_one_is(backend, example_tasks, tmp_path):
    task = example_tasks[0]
    _run(backend.prepare(task))
    fresh = DockerBackend(DockerBackendConfig())

    def no_build(*a, **k):
        raise AssertionError("rebuilt an unchanged task")

    fresh._build = no_build
    _run(fresh.prepare(task))

    changed = _copy_task(
        task,
        tmp_path / task.id,
        f"FROM {BASE_TAG}\nWORKDIR /app\nRUN echo {uuid.uuid4().hex} > /v\n",
    )
    tag = backend.image_tag(changed)
    assert tag != backend.image_tag(task)
    try:
        _run(backend.prepare(changed))
        assert backend.client.images.get(tag)
    finally:
        backend.client.images.remove(tag, force=True)
        _run(fresh.close())


def test_broken_dockerfile_fails_with_its_build_log_and_other_trials_go_on(
    backend, example_tasks, tmp_path
):
    marker = uuid.uuid4().hex[:12]
    broken = _copy_task(
        example_tasks[0],
        tmp_path / "broken-task",
        f"FROM {BASE_TAG}\nRUN echo building-{marker} && exit 7\n",
    )
    oracle = get_plugin_manager().get("agent", "oracle").create()
    verifier = get_plugin_manager().get("verifier", "harbor").create()
    results = _run(
        run_trials(
            [
                lambda t=t: run_trial(
                    t,
                    backend=backend,
                    agent=oracle,
                    verifier=verifier,
                    session_factory=StandInSessions(),
                )
                for t in (broken, example_tasks[0])
            ],
            concurrency=2,
        )
    )
    bad, good = results
    assert bad.termination == TerminationReason.BROKEN_TASK and not bad.trainable
    assert bad.reward is None
    assert "non-zero code: 7" in bad.error and f"building-{marker}" in bad.error
    assert f"building-{marker}" in bad.logs["build"]
    assert good.termination == TerminationReason.COMPLETED and good.reward.value == 1.0


class _KillsItsContainer(AgentAdapter):
    """An agent whose sandbox is killed from outside while its command runs."""

    protocol = "openai"

    def __init__(self, backend):
        self.backend = backend
        self.trial_labels = None

    def bundle(self):
        return Bundle(
            path=shutil.os.devnull and __import__("pathlib").Path("/nonexistent"), version="t"
        )

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        self.trial_labels = self.backend.client.containers.get(sandbox.id).labels
        running = asyncio.ensure_future(sandbox.exec("sleep 600"))
        await asyncio.to_thread(self.backend.client.containers.get(sandbox.id).kill)
        await running  # raises SandboxError: the container is gone
        return AgentOutcome(exit_code=0)


def test_container_killed_mid_trial_is_a_sandbox_error_leaving_nothing(backend, example_tasks):
    agent = _KillsItsContainer(backend)
    verifier = get_plugin_manager().get("verifier", "harbor").create()
    result = _run(
        run_trial(
            example_tasks[0],
            backend=backend,
            agent=agent,
            verifier=verifier,
            session_factory=StandInSessions(),
        )
    )
    assert result.termination == TerminationReason.SANDBOX_ERROR, result.error
    assert "during the agent phase" in result.error, result.error
    assert result.reward is None and not result.trainable
    assert agent.trial_labels[TRIAL] == result.trial_id
    assert backend.list_sandboxes(**{TRIAL: result.trial_id}) == []


def test_resource_limits_labels_and_workdir(backend, example_tasks):
    task = next(t for t in example_tasks if t.id == "fix-median")

    async def go():
        # the caller's labels (the run's) come along, but cannot replace the trial's own
        labels = {RUN: "r1", TRIAL: "not-this-trial"}
        sb = await backend.start(task, trial_id="limits-1", labels=labels)
        try:
            info = backend.client.api.inspect_container(sb.id)
            pwd = await sb.exec("pwd")
            return info, pwd
        finally:
            await sb.stop()

    info, pwd = _run(go())
    host = info["HostConfig"]
    assert host["NanoCpus"] == int(task.environment.cpus * 1e9)
    assert host["Memory"] == task.environment.memory_mb * 1024 * 1024
    assert host["NetworkMode"] == "none"
    labels = info["Config"]["Labels"]
    assert labels[TRIAL] == "limits-1" and labels[RUN] == "r1"
    assert labels[TASK] == "fix-median"
    assert pwd.stdout.strip() == "/app"


def test_verifier_phase_with_internet_moves_onto_the_bridge(backend, example_tasks, decoy):
    ip = decoy.attrs["NetworkSettings"]["IPAddress"]

    async def go():
        sb = await backend.start(example_tasks[0], trial_id="full-net", labels={})
        try:
            before = await probe_connect(sb, [(ip, 8000)])
            await sb.set_network("full")
            after = await probe_connect(sb, [(ip, 8000)])
            return before, after
        finally:
            await sb.stop()

    before, after = _run(go())
    assert before[f"{ip}:8000"].startswith("closed")
    assert after[f"{ip}:8000"] == "open"


def test_orphans_of_dead_processes_are_removed_at_start_up(backend):
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()

    def make(pid):
        return backend.client.containers.create(
            BASE_TAG,
            ["sleep", "600"],
            labels={
                SANDBOX: "docker",
                OWNER_HOST: host,
                OWNER_PID: str(pid),
                TEST_LABEL: "orphan",
            },
        )

    orphan, alive = make(dead.pid), make(os.getpid())
    try:
        assert _run(backend.cleanup_orphans()) >= 1
        ids = {
            c.id for c in backend.client.containers.list(all=True, filters={"label": TEST_LABEL})
        }
        assert orphan.id not in ids
        assert alive.id in ids  # a live process's sandbox is not an orphan
    finally:
        for c in (orphan, alive):
            try:
                c.remove(force=True)
            except Exception:
                pass


def test_exec_in_a_removed_container_is_a_sandbox_error(backend, example_tasks):
    async def go():
        sb = await backend.start(example_tasks[0], trial_id="gone", labels={})
        backend.client.api.remove_container(sb.id, force=True)
        try:
            with pytest.raises(SandboxError):
                await sb.exec("true")
        finally:
            await sb.stop()

    _run(go())


class _LeavesAForgerRunning(AgentAdapter):
    """Starts a detached process that keeps writing reward 1, then 'finishes'."""

    protocol = "openai"

    def bundle(self):
        return Bundle(path=Path("/nonexistent-slr-bundle"), version="test")

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        res = await sandbox.exec(
            "mkdir -p /logs/verifier; nohup setsid sh -c "
            "'while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; done' "
            ">/dev/null 2>&1 & echo started"
        )
        assert res.stdout.strip() == "started"
        return AgentOutcome(exit_code=0)


def test_processes_the_agent_left_cannot_forge_the_reward(backend, example_tasks):
    verifier = get_plugin_manager().get("verifier", "harbor").create()
    result = _run(
        run_trial(
            example_tasks[0],
            backend=backend,
            agent=_LeavesAForgerRunning(),
            verifier=verifier,
            session_factory=StandInSessions(),
        )
    )
    assert result.termination == TerminationReason.COMPLETED, result.error
    assert result.reward.value == 0.0


def test_exec_runs_as_the_requested_user(backend, example_tasks):
    async def go():
        sb = await backend.start(example_tasks[0], trial_id="user", labels={})
        try:
            return await sb.exec("id -u", user="nobody"), await sb.exec("id -u")
        finally:
            await sb.stop()

    nobody, default = _run(go())
    assert nobody.stdout.strip() == "65534" and default.stdout.strip() == "0"


def test_images_base_is_cached(tmp_path):
    slr = str(Path(sys.executable).with_name("slr"))
    res = subprocess.run([slr, "images", "base"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"{BASE_TAG} already exists" in res.stdout


class _BlocksInSandbox(AgentAdapter):
    protocol = "openai"

    def __init__(self):
        self.started = asyncio.Event()
        self.sandbox_id = None

    def bundle(self):
        return Bundle(path=Path("/nonexistent-slr-bundle"), version="test")

    async def run(self, sandbox, instruction, endpoint, *, timeout_s):
        self.sandbox_id = sandbox.id
        self.started.set()
        await sandbox.exec("sleep 600")
        return AgentOutcome(exit_code=0)


def test_a_cancelled_trial_removes_its_container(backend, example_tasks):
    agent = _BlocksInSandbox()
    verifier = get_plugin_manager().get("verifier", "harbor").create()

    async def go():
        t = asyncio.ensure_future(
            run_trial(
                example_tasks[0],
                backend=backend,
                agent=agent,
                verifier=verifier,
                session_factory=StandInSessions(),
                trial_id="cancelled-1",
            )
        )
        await agent.started.wait()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    _run(go())
    assert agent.sandbox_id is not None
    assert backend.list_sandboxes(**{TRIAL: "cancelled-1"}) == []


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http+docker://localhost", True),
        ("http://127.0.0.1:2375", True),
        ("https://localhost:2376", True),
        ("https://build-farm.example:2376", False),
    ],
)
def test_daemon_locality_is_read_from_the_url(url, local):
    # Only the URL is read: nothing is contacted.
    assert daemon_is_local(url) is local


def test_the_agent_cannot_kill_its_own_container(backend, example_tasks):
    """PID 1 (the relay) ignores signals from inside its namespace, and end_processes
    spares it: an agent cannot turn its failure into an excluded sandbox_error this way."""

    async def go():
        sb = await backend.start(example_tasks[0], trial_id="selfkill", labels={})
        try:
            await sb.exec("kill -9 1; kill -9 -1", user="root")
            await sb.end_processes()
            return await sb.exec("echo alive")
        finally:
            await sb.stop()

    assert _run(go()).stdout.strip() == "alive"


def test_a_string_command_sees_the_path_the_image_sets(backend, example_tasks, tmp_path):
    """SWE task images put venvs / conda / toolchains first on PATH with ENV; a string command
    must find them (a login shell would not: Debian's /etc/profile resets PATH)."""
    task = _copy_task(
        example_tasks[0],
        tmp_path / "image-path",
        f"FROM {BASE_TAG}\n"
        "ENV PATH=/opt/slr-venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        "RUN mkdir -p /opt/slr-venv/bin && printf '#!/bin/sh\\necho from-the-image-path\\n' "
        "> /opt/slr-venv/bin/slr-image-tool && chmod +x /opt/slr-venv/bin/slr-image-tool\n"
        "WORKDIR /app\n",
    )

    async def go():
        await backend.prepare(task)
        sb = await backend.start(task, trial_id=f"path-{uuid.uuid4().hex[:6]}", labels={})
        try:
            return await sb.exec("slr-image-tool; echo $PATH")
        finally:
            await sb.stop()

    try:
        res = _run(go())
    finally:
        backend.client.images.remove(backend.image_tag(task), force=True)
    assert res.exit_code == 0, res.stderr
    tool, path = res.stdout.splitlines()
    assert tool == "from-the-image-path"
    assert path.startswith("/opt/slr-venv/bin:")
