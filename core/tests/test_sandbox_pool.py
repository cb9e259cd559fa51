"""The warm sandbox pool (slr.sandboxing.pool) on the real local backend: fresh sandboxes,
broken ones replaced, nothing left at the end or after a SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend

from slr.sandboxing.pool import PooledSandbox, SandboxPool
from slr.tasks import load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def make_backend(root: Path) -> LocalBackend:
    return LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap", workspace_dir=str(root / "ws"), cache_dir=str(root / "cache")
        )
    )


def workspaces(root: Path) -> list[Path]:
    ws = root / "ws"
    return sorted(ws.iterdir()) if ws.is_dir() else []


@pytest.mark.timeout(60)
def test_pooled_sandboxes_are_fresh_and_the_pool_shrinks_to_nothing(tmp_path):
    task = load_task(EXAMPLES / "hello-world")

    async def main() -> None:
        pool = SandboxPool(make_backend(tmp_path), size=2)
        await pool.prepare(task)
        pool.expect([task, task, task])
        await pool.wait_ready()
        assert pool.warm == 2 and len(workspaces(tmp_path)) == 2
        first = await pool.start(task, trial_id="t1", labels={})
        assert isinstance(first, PooledSandbox) and first.pool_start_s > 0
        assert (await first.exec("echo secret > /tmp/left-behind && echo hi")).stdout == "hi\n"
        await first.stop()
        second = await pool.start(task, trial_id="t2", labels={})
        assert second.id != first.id
        seen = await second.exec("cat /tmp/left-behind 2>&1 || echo absent")
        assert "absent" in seen.stdout  # nothing of the earlier trial
        await second.stop()
        await pool.wait_ready()  # the third expected trial's sandbox is warm now
        assert pool.warm == 1
        await pool.close()
        assert pool.warm == 0 and workspaces(tmp_path) == []

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_broken_pooled_sandbox_is_replaced_not_handed_out(tmp_path):
    task = load_task(EXAMPLES / "hello-world")

    async def main() -> None:
        pool = SandboxPool(make_backend(tmp_path), size=1)
        pool.expect([task])
        await pool.wait_ready()
        (broken,) = workspaces(tmp_path)
        import shutil

        shutil.rmtree(broken / "fs")  # the pooled sandbox's root is gone
        sandbox = await pool.start(task, trial_id="t1", labels={})
        try:
            assert pool.replaced == 1 and not isinstance(sandbox, PooledSandbox)
            assert (await sandbox.exec("echo ok")).stdout == "ok\n"
            assert broken not in workspaces(tmp_path)
        finally:
            await sandbox.stop()
            await pool.close()
        assert workspaces(tmp_path) == []

    asyncio.run(main())


_HOLDER = """
import asyncio, sys
from pathlib import Path
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend
from slr.sandboxing.pool import SandboxPool
from slr.tasks import load_task

async def main():
    root = Path(sys.argv[1])
    backend = LocalBackend(LocalBackendConfig(isolation="bubblewrap",
        workspace_dir=str(root / "ws"), cache_dir=str(root / "cache")))
    pool = SandboxPool(backend, size=2)
    task = load_task(Path(sys.argv[2]))
    pool.expect([task, task])
    await pool.wait_ready()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_orphans_of_a_killed_pool_are_cleaned_at_the_next_start(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_HOLDER),
            str(tmp_path),
            str(EXAMPLES / "hello-world"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        left = workspaces(tmp_path)
        assert len(left) == 2
        owners = {json.loads((w / "owner.json").read_text())["pid"] for w in left}
        assert owners == {holder.pid}
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    removed = asyncio.run(make_backend(tmp_path).cleanup_orphans())
    assert removed >= 2 and workspaces(tmp_path) == []
