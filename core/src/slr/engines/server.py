"""``ServerProcess``: one launched inference server (vLLM, SGLang, ...) on this machine.

Each server runs in its own process group (so stopping it also stops the workers it
spawned), logs to a file, and counts as started once ``GET /health`` answers 200. If the
process exits first, the error quotes the end of its log.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import structlog

from slr.contracts import EngineUnavailable

log = structlog.get_logger()


def free_port(host: str) -> int:
    """A port on ``host`` that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_port(host: str, *, base_port: int, index: int) -> int:
    """The port of launched server ``index``: ``base_port + index``, or a free port."""
    return base_port + index if base_port else free_port(host)


def replica_env(gpus_per_replica: Sequence[str], index: int) -> dict[str, str]:
    """This process's environment, with server ``index``'s ``CUDA_VISIBLE_DEVICES``."""
    env = dict(os.environ)
    if gpus_per_replica:
        env["CUDA_VISIBLE_DEVICES"] = gpus_per_replica[index % len(gpus_per_replica)]
    return env


class ServerProcess:
    """One launched server process: ``command`` run with its output in ``log_dir``.

    ``kind`` names the server in logs and errors (``"vllm"``, ``"sglang"``); the log file
    is ``<log_dir>/<kind>-<index>.log`` (``log_dir`` empty: a fresh temporary folder).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        kind: str,
        url: str,
        index: int = 0,
        log_dir: str = "",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.index = index
        self.url = url
        self.command = list(command)
        folder = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(f"-{kind}"))
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / f"{kind}-{index}.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        log.info(
            f"{kind} server launched", url=self.url, pid=self.process.pid, log=str(self.log_path)
        )

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def wait_ready(self, client: httpx.AsyncClient, timeout_s: float) -> None:
        """Return once ``/health`` answers 200; raise if the process dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            if not self.running:
                raise EngineUnavailable(
                    f"{self.kind} server {self.index} exited with code "
                    f"{self.process.returncode} before it was ready. Last log lines "
                    f"({self.log_path}):\n{self.log_tail()}"
                )
            try:
                response = await client.get(f"{self.url}/health", timeout=5)
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise EngineUnavailable(
                    f"{self.kind} server {self.index} was not healthy after {timeout_s:.0f}s; "
                    f"last log lines ({self.log_path}):\n{self.log_tail()}"
                )
            # a readiness poll with backoff: the server offers no push notification
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the server's process group; SIGKILL what is left after ``grace_s``."""
        if self.running:
            pgid = self.process.pid
            _signal_group(pgid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                self.process.wait(10)
            # workers that outlive the leader (or ignore SIGTERM) go with the group
            _signal_group(pgid, signal.SIGKILL)
            _wait_group_gone(pgid, timeout_s=10.0)
        self._log.close()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def _wait_group_gone(pgid: int, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)  # SIGKILL was sent; this waits for the kernel to carry it out
