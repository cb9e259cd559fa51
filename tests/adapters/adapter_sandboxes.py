"""Sandboxes for the adapter tests.

``HostSubprocessSandboxStandIn`` runs commands as host subprocesses in a fresh folder. It
stands in for the ``local`` and ``docker`` backends while those are not in this branch; the
tests switch to the real backends when their distributions are installed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from slr.contracts import ExecResult


class HostSubprocessSandboxStandIn:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="slr-standin-"))
        self.workdir = self.root / "work"
        self.workdir.mkdir()
        self.id = self.root.name

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        argv = ["bash", "-lc", command] if isinstance(command, str) else list(command)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd or self.workdir,
            env={**os.environ, **(env or {})},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
            timed_out = False
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = await proc.communicate()
            timed_out = True
        return ExecResult(
            exit_code=proc.returncode if proc.returncode is not None else -9,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    async def upload(self, src: Path, dest: str) -> None:
        target = Path(dest)
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)

    async def download(self, src: str, dest: Path) -> None:
        if Path(src).is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)

    def proxy_url(self, host_url: str) -> str:
        return host_url

    async def set_network(self, mode: str) -> None:
        pass

    async def stop(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
