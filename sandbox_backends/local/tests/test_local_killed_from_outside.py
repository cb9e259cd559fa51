"""A local sandbox killed from outside (its bubblewrap SIGKILLed on the host, as an OOM
killer, an operator or a dying node would) is a ``SandboxError``, so the trial ends as
``sandbox_error``, an infrastructure failure; a command killed inside the sandbox is
still that command's exit status, the agent's doing.

Without the check, the outside kill read as exit 137 from the command: the agent's crash
or a failed test run, scored against the policy.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from slr_backend_local import LocalBackendConfig
from slr_backend_local.backend import LocalBackend

from slr.contracts import SandboxError

pytestmark = pytest.mark.timeout(60)


def _bwrap_running(marker_path: Path) -> int | None:
    """The host pid of the bwrap whose command line names ``marker_path``, if any."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"bwrap") and str(marker_path).encode() in b" ".join(argv):
            return int(entry.name)
    return None


def test_bwrap_killed_from_outside_is_a_sandbox_error(tmp_path, example_tasks):
    backend = LocalBackend(
        LocalBackendConfig(
            isolation="bubblewrap",
            workspace_dir=str(tmp_path / "ws"),
            cache_dir=str(tmp_path / "cache"),
        )
    )

    async def go():
        sb = await backend.start(example_tasks[0], trial_id="outside-kill", labels={})
        try:
            inside = await sb.exec("kill -9 $$")
            # killed inside: the command's own status (bwrap reports it as 256 - signal)
            assert inside.exit_code in (137, 247), inside
            # a command that says it started (a file on the host side of the workspace)
            ready = sb.host_path("/tmp/started")
            running = asyncio.ensure_future(sb.exec("touch /tmp/started; exec sleep 60"))
            while not ready.exists():
                assert not running.done(), running.result()
                await asyncio.sleep(0.01)  # polling the workspace for the command's mark
            pid = _bwrap_running(sb.root)
            assert pid is not None, "no bwrap process for the sandbox"
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(SandboxError, match="killed by signal 9 from outside"):
                await running
        finally:
            await sb.stop()
            await backend.close()

    asyncio.run(go())
