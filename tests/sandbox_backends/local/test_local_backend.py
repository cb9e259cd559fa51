"""The local backend (bubblewrap) against the sandbox conformance suite, plus its own rules."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import structlog.testing
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import OWNER_FILE, LocalBackend

from slr.contracts import SandboxError
from slr.testing import SandboxBackendTests

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
            return killed, await running
        finally:
            await sb.stop()

    killed, res = asyncio.run(go())
    assert killed >= 1
    assert not res.timed_out and res.exit_code == 137
