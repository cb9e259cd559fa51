"""Docker backend edge cases: image names for any task id, SDK stream errors.

The name checks ask the real daemon (it is the judge of what a valid reference is); the
stream check runs a real exec in a real container and has the SDK's own demultiplexer fail.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slr_backend_docker import DockerBackendConfig
from slr_backend_docker.backend import MIN_THREADS, THREADS_PER_SANDBOX, DockerBackend
from slr_backend_docker.base_image import BASE_TAG
from slr_backend_docker.tags import _COMPONENT, _repo_name

from slr.contracts import SandboxError
from slr.sandboxing.labels import OWNER_PID, SANDBOX

NASTY_IDS = [
    "a-_b",  # the colleague's case: "-_" is no separator docker accepts
    "a_-b",
    "a..b",
    "a___b",
    "_leading",
    "trailing-",
    "UPPER_Case-ID",
    "ünïcödé/task",
    "owner/repo#1234",
    "with space:and:colons@sha",
    "-",
    "...",
    "x" * 300,
    "django__django-11099",
]


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=400))
def test_every_task_id_gives_a_valid_repository_name(task_id):
    name = _repo_name("slr-task", task_id)
    assert _COMPONENT.fullmatch(name), name
    assert len(name) <= 255


def test_valid_ids_keep_their_name_and_lossy_ones_stay_distinct():
    assert _repo_name("slr-task", "django__django-11099") == "slr-task-django__django-11099"
    names = {_repo_name("slr-task", i) for i in ("a-_b", "a_-b", "a--b", "a b", "a/b")}
    assert len(names) == 5
    # what today's code produced for a valid id is unchanged: cached images stay usable
    assert _repo_name("slr-task", "calc-1") == "slr-task-calc-1"


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_the_daemon_accepts_the_name_of_every_nasty_task_id():
    backend = DockerBackend(DockerBackendConfig())
    api = backend.client.api
    refused = {}
    try:
        for task_id in NASTY_IDS:
            repo = _repo_name("slr-task", task_id)
            try:
                api.tag(BASE_TAG, repo, "test")
            except Exception as exc:  # the daemon's refusal, whatever its type
                refused[task_id] = f"{repo}: {exc}"
            else:
                api.remove_image(f"{repo}:test", noprune=True)
    finally:
        asyncio.run(backend.close())
    assert refused == {}


class _StreamMisread:
    """The real low-level client, except that reading an exec's output goes wrong the way
    the colleague saw it: the SDK's own demultiplexer meets a frame whose stream id is 58
    (``:``, the first byte of something that is not a docker frame). The daemon cannot be
    made to send such a frame on purpose, so the SDK's function is fed one directly."""

    def __init__(self, api):
        self._api = api

    def __getattr__(self, name):
        return getattr(self._api, name)

    def exec_start(self, exec_id, **kwargs):
        from docker.utils.socket import demux_adaptor

        self._api.exec_start(exec_id, **kwargs)
        return demux_adaptor(58, b": not a frame")


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_an_sdk_value_error_in_exec_is_a_sandbox_error(example_tasks):
    async def go():
        # commands through the daemon's exec API, as every command of the verifier phase
        backend = DockerBackend(DockerBackendConfig(exec_server=False))
        sb = await backend.start(example_tasks[0], trial_id="misread", labels={})
        try:
            sb._api = _StreamMisread(sb._api)
            with pytest.raises(SandboxError, match="58 is not a valid stream") as err:
                await sb.exec("true")
            assert "could not read the daemon's answer to exec_start" in str(err.value)
        finally:
            await sb.stop()
            left = [
                c.name
                for c in backend.client.containers.list(all=True, filters={"label": SANDBOX})
                if c.labels.get(OWNER_PID) == str(os.getpid())
            ]
            await backend.close()
        assert left == []

    asyncio.run(go())


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_a_daemon_that_went_away_is_a_sandbox_error(example_tasks, tmp_path):
    """A daemon restarted under a running trial: the SDK raises the transport's own error
    (requests' ConnectionError), which the trial took for the agent's failure and scored.
    The sandbox's client is pointed at a socket nobody listens on, which is what it meets
    while the daemon is down."""
    import docker

    async def go():
        backend = DockerBackend(DockerBackendConfig(exec_server=False))
        sb = await backend.start(example_tasks[0], trial_id="daemon-gone", labels={})
        real_api = sb._api
        try:
            sb._api = docker.APIClient(
                base_url=f"unix://{tmp_path}/docker.sock", version=real_api.api_version
            )
            with pytest.raises(SandboxError, match="did not answer exec_create"):
                await sb.exec("true")
            assert not await sb.healthy()
        finally:
            sb._api = real_api
            await sb.stop()
            await backend.close()

    asyncio.run(go())


@pytest.mark.timeout(30)
def test_starting_a_sandbox_while_the_daemon_is_down_is_a_sandbox_error(example_tasks, tmp_path):
    """Trials that start while the daemon restarts: the image lookup's transport error
    becomes a ``SandboxError`` naming the daemon (no daemon needed: nothing listens), at
    once with ``daemon_wait_s = 0``."""
    import docker

    async def go():
        dead = f"unix://{tmp_path}/docker.sock"
        backend = DockerBackend(DockerBackendConfig(base_url=dead, daemon_wait_s=0))
        # connected before the daemon went away (connecting now would fail at its ping)
        backend._client = docker.DockerClient(base_url=dead, version="1.41")
        try:
            with pytest.raises(SandboxError, match="did not answer") as err:
                await backend.start(example_tasks[0], trial_id="daemon-down", labels={})
            assert str(tmp_path) in str(err.value)
        finally:
            await backend.close()

    asyncio.run(go())


def _real_daemon_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip(f"needs the daemon on a unix socket here, not {host}")
    return host.removeprefix("unix://")


@pytest.mark.docker
@pytest.mark.timeout(60)
@pytest.mark.parametrize("first", ["prepare", "start"])
def test_a_start_waits_for_a_restarting_daemon(example_tasks, tmp_path, first):
    """Trials started while the daemon restarts wait for it (``daemon_wait_s``) instead of
    all failing at once, which let a run burn through its tasks during a 12 s restart.
    The daemon "comes back" when its socket appears: a link to the real daemon's, made
    right after the backend's first call found it unreachable."""
    import docker

    sock = tmp_path / "docker.sock"
    url = f"unix://{sock}"

    async def go():
        backend = DockerBackend(DockerBackendConfig(base_url=url, daemon_wait_s=60))
        backend._client = docker.DockerClient(base_url=url, version="1.41")
        failed = []
        real_call = backend.call

        async def call(fn, *args, **kwargs):
            try:
                return await real_call(fn, *args, **kwargs)
            except SandboxError:
                if not sock.exists():  # the first call that found the daemon gone
                    failed.append(fn.__name__)
                    sock.symlink_to(_real_daemon_socket())
                raise

        backend.call = call
        try:
            if first == "prepare":  # what a trial does first
                await backend.prepare(example_tasks[0])
            sb = await backend.start(example_tasks[0], trial_id="waited", labels={})
            try:
                assert (await sb.exec("echo back")).stdout.strip() == "back"
            finally:
                await sb.stop()
        finally:
            await backend.close()
        assert failed == ["_image_exists"]

    asyncio.run(go())


def test_the_thread_pool_is_sized_to_the_runs_sandboxes():
    from slr.config import load_config
    from slr.plugins import get_plugin_manager

    cfg = load_config(
        data={"backend": {"name": "docker"}, "rollout": {"concurrency": 96, "pool_size": 8}},
        plugins=get_plugin_manager(),
        only_plugins=("backend",),
    )
    backend = DockerBackend.from_config(cfg)
    assert backend.threads == THREADS_PER_SANDBOX * (96 + 8) > 64  # the old fixed pool
    assert DockerBackend(DockerBackendConfig(), sandboxes=1).threads == MIN_THREADS


@pytest.mark.docker
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sandboxes", [4])
def test_timed_out_commands_are_killed_while_every_other_command_runs(
    example_tasks, monkeypatch, sandboxes
):
    """As many commands as the pool was sized for run at once and all time out: each kill
    gets a thread of its own. (With a pool of one thread per command, as the fixed 64 threads
    were for 64 trials, the kills queue behind the very commands they should end: measured,
    the four 1 s timeouts took 61 s, the commands' own end.)"""
    monkeypatch.setattr("slr_backend_docker.backend.MIN_THREADS", 0)

    async def go():
        backend = DockerBackend(DockerBackendConfig(), sandboxes=sandboxes)
        assert backend.threads == THREADS_PER_SANDBOX * sandboxes
        sb = await backend.start(example_tasks[0], trial_id="many", labels={})
        try:
            t = time.monotonic()
            results = await asyncio.gather(
                *(sb.exec(["sleep", "60"], timeout_s=1) for _ in range(sandboxes))
            )
            return results, time.monotonic() - t
        finally:
            await sb.stop()
            await backend.close()

    results, took = asyncio.run(go())
    assert all(r.timed_out for r in results)
    assert took < 30  # a starved kill waits for the 60 s commands to end by themselves
