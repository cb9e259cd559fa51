"""The local backend (bubblewrap) against the sandbox conformance suite, plus its own rules."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import structlog.testing
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import OWNER_FILE, LocalBackend

from slr.contracts import SandboxError
from slr_testkit import SandboxBackendTests

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-backend")
    b = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            workspace_dir=str(root / "ws"),
            cache_dir=str(root / "cache"),
        )
    )
    yield b
    asyncio.run(b.close())
    leftovers = [p.name for p in (root / "ws").iterdir()] if (root / "ws").exists() else []
    assert leftovers == [], f"workspaces left behind: {leftovers}"


class TestLocalConformance(SandboxBackendTests):
    pass


def test_host_secrets_and_home_are_invisible(backend, example_tasks):
    async def go():
        sb = await backend.start(example_tasks[0], trial_id="secrets", labels={})
        try:
            # This repository's own folder on the host must not be visible either.
            return await sb.exec(
                f"ls /etc/shadow {REPO} /home/* /root/.ssh 2>&1; touch /usr/x 2>&1; echo $(id -u)"
            )
        finally:
            await sb.stop()

    res = asyncio.run(go())
    assert "cannot access '/etc/shadow'" in res.stdout
    assert f"cannot access '{REPO}'" in res.stdout
    assert "Read-only file system" in res.stdout or "Permission denied" in res.stdout


def test_unsupported_dockerfile_is_a_sandbox_error_naming_the_line(
    backend, example_tasks, tmp_path
):
    from slr.tasks import load_task

    task_dir = tmp_path / "needs-url"
    shutil.copytree(example_tasks[0].path, task_dir)
    (task_dir / "environment" / "Dockerfile").write_text(
        "FROM slr-base:bookworm\nADD https://example.invalid/x.tgz /opt/\n"
    )
    with pytest.raises(SandboxError, match=r"Dockerfile:2: ADD of a URL"):
        asyncio.run(backend.prepare(load_task(task_dir)))


def test_orphaned_workspaces_are_removed(backend, example_tasks):
    sb = asyncio.run(backend.start(example_tasks[0], trial_id="orphan", labels={}))
    dead = subprocess.Popen(["true"])
    dead.wait()
    owner = sb.workspace / OWNER_FILE
    owner.write_text(json.dumps({"pid": dead.pid, "trial_id": "orphan"}))
    assert asyncio.run(backend.cleanup_orphans()) >= 1
    assert not sb.workspace.exists()
    asyncio.run(sb.stop())


def test_without_bubblewrap_it_warns_and_runs_plain_subprocesses(tmp_path, example_tasks):
    with structlog.testing.capture_logs() as logs:
        b = LocalBackend(
            LocalBackendConfig(
                isolation="none",
                workspace_dir=str(tmp_path / "ws"),
                cache_dir=str(tmp_path / "c"),
                unsafe_host_paths=True,
            )
        )
    assert any("WITHOUT isolation" in e["event"] and e["log_level"] == "warning" for e in logs)
    assert not b.isolated

    async def go():
        sb = await b.start(example_tasks[0], trial_id="plain", labels={})
        try:
            return sb, await sb.exec("pwd")
        finally:
            await sb.stop()

    sb, res = asyncio.run(go())
    assert res.stdout.strip() == str(sb.root / "app")


def test_without_bubblewrap_trials_need_an_explicit_opt_in(tmp_path, example_tasks):
    b = LocalBackend(LocalBackendConfig(isolation="none", workspace_dir=str(tmp_path / "ws")))
    with pytest.raises(SandboxError, match="unsafe_host_paths"):
        asyncio.run(b.start(example_tasks[0], trial_id="refused", labels={}))


def test_workspace_processes_are_found_and_killed_by_their_root(backend, example_tasks):
    from slr_backend_local.sandbox import kill_workspace_processes

    async def go():
        sb = await backend.start(example_tasks[0], trial_id="by-root", labels={})
        try:
            running = asyncio.ensure_future(sb.exec("touch /tmp/started; sleep 300", timeout_s=60))
            marker = sb.host_path("/tmp/started")
            while not marker.exists():  # the command is running once its marker exists
                await asyncio.sleep(0.02)
            killed = kill_workspace_processes(sb.root)
            # a sandbox killed by someone else (here: the test, as an orphan clean-up would)
            # is an infrastructure failure, never a command that merely exited 137
            with pytest.raises(SandboxError, match="killed by signal 9 from outside"):
                await running
            return killed
        finally:
            await sb.stop()

    assert asyncio.run(go()) >= 1


def _held_bwrap(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A bwrap that says when it has cloned its sandbox's init (--info-fd) and holds that init
    in its set-up (--block-fd) until a byte is written to ``release``."""
    info, release = tmp_path / "info", tmp_path / "release"
    os.mkfifo(info)
    os.mkfifo(release)
    wrapper = tmp_path / "bwrap-held"
    wrapper.write_text(
        f"#!/bin/sh\nexec 9<>{release} 8>{info}\n"
        f'exec {shutil.which("bwrap")} --block-fd 9 --info-fd 8 "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper, info, release


async def _read_fifo(path: Path, timeout_s: float) -> str | None:
    """The first line written to the FIFO ``path`` within ``timeout_s``, or ``None``. Read
    without blocking: a thread blocked in ``read_text`` on a FIFO nobody opens would hold
    ``asyncio.run``'s shutdown (and the test) until pytest's timeout."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    data = b""
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError):  # a writer, nothing written yet
                data += os.read(fd, 64)
            if data.endswith(b"\n"):
                return data.decode()
            await asyncio.sleep(0.05)
        return None
    finally:
        os.close(fd)


async def _held_at_the_block_fd(init: int, timeout_s: float = 30) -> None:
    """Wait until bwrap's init reads its --block-fd. bwrap reports the init (--info-fd)
    right after cloning it, and only then lets it on (an eventfd, once the parent has set
    the namespaces up); killing bwrap before that leaves the init waiting for it forever
    (on a busy machine the test's kill came first: the init never reached the command)."""
    deadline = time.monotonic() + timeout_s
    while "pipe" not in Path(f"/proc/{init}/wchan").read_text():
        assert time.monotonic() < deadline, "bwrap's init never reached --block-fd: " + (
            _process_state(init)
        )
        await asyncio.sleep(0.01)


def _process_state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return f"pid {pid} is gone"
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    parent = next(line for line in status.splitlines() if line.startswith("PPid:"))
    return f"pid {pid}: {state}, {parent}, waiting in {wchan or '-'}"


def _children(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [_process_state(int(k)) for k in kids]
    return []


@pytest.mark.timeout(120)
def test_a_command_whose_bwrap_died_during_set_up_is_still_ended(backend, example_tasks, tmp_path):
    # bwrap's sandbox init (pid 1 of the command's namespace) asks for --die-with-parent's
    # signal only once its set-up is done. If bwrap dies first (killed alone, as asyncio's own
    # clean-up of a cancelled spawn does), the init is re-parented, starts the command in its
    # own session and holds the exec's pipes: a cancelled trial then waited on them forever.
    from slr_backend_local.sandbox import kill_workspace_processes

    wrapper, info, release = _held_bwrap(tmp_path)

    async def go():
        sb = await backend.start(example_tasks[0], trial_id="escaped-init", labels={})
        try:
            sb.bwrap = str(wrapper)
            started = sb.host_path("/tmp/started")
            os.mkfifo(started)
            running = asyncio.ensure_future(sb.exec("echo up > /tmp/started; exec sleep 600"))
            init = json.loads(await asyncio.to_thread(info.read_text))["child-pid"]
            await _held_at_the_block_fd(init)
            status = Path(f"/proc/{init}/status").read_text()
            bwrap_pid = int(status.split("PPid:")[1].split()[0])
            os.kill(bwrap_pid, signal.SIGKILL)  # bwrap dies; its init is still in its set-up
            release.write_text("x")  # the orphaned init carries on and starts the command
            up = await _read_fifo(started, 60)
            if up is None:
                pytest.fail(
                    "the orphaned sandbox init never started the command within 60 s "
                    f"({_process_state(init)}; its children: {_children(init) or 'none'})"
                )
            assert up == "up\n"
            assert Path(f"/proc/{init}").exists(), "the init did not outlive bwrap"
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            return kill_workspace_processes(sb.root)
        finally:
            await sb.stop()

    assert asyncio.run(go()) == 0, "a process of the cancelled command outlived it"


def test_an_escaped_init_of_a_dead_owner_is_killed_by_cleanup_orphans(
    backend, example_tasks, tmp_path
):
    # When slr itself is killed, bwrap follows it (--die-with-parent), but an init still in its
    # set-up escapes as above, with nothing left to end it: the next start's cleanup does.
    from slr_backend_local.sandbox import kill_workspace_processes

    wrapper, info, release = _held_bwrap(tmp_path)

    async def go():
        sb = await backend.start(example_tasks[0], trial_id="dead-owner", labels={})
        sb.bwrap = str(wrapper)
        running = asyncio.ensure_future(sb.exec("sleep 600"))
        init = json.loads(await asyncio.to_thread(info.read_text))["child-pid"]
        await _held_at_the_block_fd(init)
        status = Path(f"/proc/{init}/status").read_text()
        os.kill(int(status.split("PPid:")[1].split()[0]), signal.SIGKILL)
        release.write_text("x")
        dead = await asyncio.create_subprocess_exec("true")
        await dead.wait()
        (sb.workspace / OWNER_FILE).write_text(json.dumps({"pid": dead.pid}))
        removed = await backend.cleanup_orphans()
        left = kill_workspace_processes(sb.root)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError, SandboxError):
            await running
        await sb.stop()
        return removed, left

    removed, left = asyncio.run(go())
    assert removed >= 1 and left == 0


@pytest.mark.timeout(60)
def test_a_start_cancelled_during_the_copy_leaves_no_workspace(backend, example_tasks, monkeypatch):
    # The copy of the task's root runs on a thread, which a cancel cannot stop: the start
    # must wait for it before removing the workspace, or the thread writes into a folder
    # that no owner file claims any more (and cleanup_orphans never removes it).
    import threading
    import time

    from slr_backend_local import backend as module

    real, copying, copied = module._timed_copy, threading.Event(), threading.Event()

    def slow_copy(src, dest):
        copying.set()
        time.sleep(0.5)  # still copying when the cancel arrives
        try:
            return real(src, dest)
        finally:
            copied.set()

    monkeypatch.setattr(module, "_timed_copy", slow_copy)
    asyncio.run(backend.prepare(example_tasks[0]))
    before = set(backend.workspace_dir.iterdir()) if backend.workspace_dir.exists() else set()

    async def cancel_mid_copy():
        start = asyncio.create_task(
            backend.start(example_tasks[0], trial_id="cancelled-start", labels={})
        )
        await asyncio.to_thread(copying.wait, 10)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start

    asyncio.run(cancel_mid_copy())
    assert copied.wait(10)  # the thread has written all it will write
    assert set(backend.workspace_dir.iterdir()) == before
