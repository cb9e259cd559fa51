"""The docker backend's exec server (PID 1 runs the agent phase's commands): the same
results as the daemon's exec API, no way in for the agent, the daemon again for the
verifier phase, and the daemon when the server cannot start.

Needs dockerd and the base image, like the rest of sandbox_backends/docker/tests.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid

import pytest
from slr_backend_docker import DockerBackendConfig
from slr_backend_docker.backend import DockerBackend
from slr_backend_docker.base_image import BASE_TAG

from slr.contracts import SandboxError
from slr.tasks import load_task

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

# (command, exec options): each runs through both paths; exit code and stdout must agree
SAME_AS_DOCKER_EXEC = [
    ("echo out; echo err >&2; exit 3", {}),
    ("id; echo $HOME; pwd", {"user": "nobody", "cwd": "/tmp"}),
    ("id -u; id -g; echo $HOME", {"user": "4321"}),
    ("id -u; id -g", {"user": "nobody:root"}),
    ('echo $FOO; echo $HOSTNAME; echo $PATH; test -n "$SLR_EXEC_ID"', {"env": {"FOO": "b r"}}),
    ("kill -9 $$", {}),
    ("echo a; (sleep 30; echo never) & echo b", {}),
    ("true", {"user": "no-such-user"}),
    ("true", {"cwd": "/no/such/folder"}),
    ("test -t 0 || cat", {}),  # stdin: nothing to read, not a terminal
]


class _NoDaemonExec:
    """The real low-level client with its exec API taken away: a command that still runs
    went through the exec server."""

    def __init__(self, api):
        self._api = api

    def __getattr__(self, name):
        if name.startswith("exec_"):
            raise AssertionError(f"{name}: this command went through the daemon")
        return getattr(self._api, name)


def _run(coro):
    return asyncio.run(coro)


def test_commands_give_what_docker_exec_gives(example_tasks):
    async def one(exec_server: bool):
        backend = DockerBackend(DockerBackendConfig(exec_server=exec_server))
        sb = await backend.start(example_tasks[0], trial_id=f"parity-{exec_server}", labels={})
        try:
            assert (sb.channel is not None) is exec_server
            if exec_server:
                sb._api = _NoDaemonExec(sb._api)
            results = []
            for command, options in SAME_AS_DOCKER_EXEC:
                res = await sb.exec(command, timeout_s=60, **options)
                # a command that could not start: each path words the reason its own way
                stdout = res.stdout if res.exit_code < 126 else None
                results.append((command, res.exit_code, stdout, res.timed_out))
            return results
        finally:
            await sb.stop()
            await backend.close()

    async def both():
        return await asyncio.gather(one(True), one(False))

    server, daemon = _run(both())
    assert server == daemon
    assert server[6][2] == "a\nb\n"  # returned when the command ended, not its leftover


def test_every_concurrent_command_gets_its_own_exit_code_and_no_zombie_stays(example_tasks):
    """PID 1 reaps every child (orphans included) and hands each command its own status."""

    async def go():
        backend = DockerBackend(DockerBackendConfig())
        sb = await backend.start(example_tasks[0], trial_id="reaper", labels={})
        try:
            sb._api = _NoDaemonExec(sb._api)
            codes = await asyncio.gather(
                *(sb.exec(f"(sleep 0.$RANDOM &); exit {i}") for i in range(24))
            )
            timed = await sb.exec("sleep 60 & sleep 60; echo late", timeout_s=1)
            # an orphan of the timed-out command ends on its own after its parent died
            await sb.exec("sh -c 'sleep 0.2 &' ; sleep 0.5")
            zombies = await sb.exec("ps -eo stat= | grep -c '^Z' || true")
            return [r.exit_code for r in codes], timed, zombies.stdout.strip()
        finally:
            await sb.stop()
            await backend.close()

    codes, timed, zombies = _run(go())
    assert codes == list(range(24))
    assert timed.timed_out and timed.exit_code == 137 and "late" not in timed.stdout
    assert zombies == "0"


def test_the_agent_cannot_reach_the_exec_server_and_the_verifier_phase_uses_the_daemon(
    example_tasks,
):
    async def go():
        backend = DockerBackend(DockerBackendConfig())
        sb = await backend.start(example_tasks[0], trial_id="exec-server-safety", labels={})
        try:
            socket_gone = await sb.exec("ls /run/slr; test ! -e /run/slr/exec.sock")
            fds = await sb.exec(
                ["sh", "-c", 'for f in /proc/$$/fd/*; do readlink "$f"; done; true']
            )
            await sb.end_processes()  # the agent phase is over: PID 1 is not trusted again
            assert sb.channel is not None and sb.channel.closed
            real_api = sb._api
            sb._api = _NoDaemonExec(real_api)
            with pytest.raises(AssertionError, match="went through the daemon"):
                await sb.exec("echo verifier")
            sb._api = real_api
            return socket_gone, fds, await sb.exec("echo verifier")
        finally:
            await sb.stop()
            await backend.close()

    socket_gone, fds, verifier = _run(go())
    assert socket_gone.exit_code == 0, socket_gone.stdout
    # stdin, stdout, stderr: no descriptor of the channel (a socket) leaks into commands
    assert "pipe:" in fds.stdout and "socket:" not in fds.stdout
    assert verifier.stdout == "verifier\n"


def test_an_image_whose_user_is_not_root_runs_commands_through_the_daemon(example_tasks, tmp_path):
    """PID 1 runs as the image's user; only root can run commands as any user, so the
    server does not start and every command goes through the daemon, as before."""
    dst = tmp_path / "not-root"
    shutil.copytree(example_tasks[0].path, dst)
    (dst / "environment" / "Dockerfile").write_text(f"FROM {BASE_TAG}\nUSER nobody\n")
    task = load_task(dst)
    backend = DockerBackend(DockerBackendConfig())

    async def go():
        await backend.prepare(task)
        sb = await backend.start(task, trial_id=f"not-root-{uuid.uuid4().hex[:6]}", labels={})
        try:
            return sb.channel, await sb.exec("id -u"), await sb.exec("id -u", user="root")
        finally:
            await sb.stop()
            await backend.close()

    try:
        channel, default, root = _run(go())
    finally:
        backend.client.images.remove(backend.image_tag(task), force=True)
    assert channel is None
    assert (default.stdout, root.stdout) == ("65534\n", "0\n")


def test_a_container_that_dies_mid_command_is_a_sandbox_error(example_tasks):
    async def go():
        backend = DockerBackend(DockerBackendConfig())
        sb = await backend.start(example_tasks[0], trial_id="dies", labels={})
        try:
            running = asyncio.ensure_future(sb.exec("sleep 60"))
            await sb.exec("true")  # the long one has started
            await backend.call(backend.client.api.kill, sb.id)
            with pytest.raises(SandboxError):
                await running
        finally:
            await sb.stop()
            await backend.close()

    _run(go())
