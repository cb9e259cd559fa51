"""Launching and stopping SGLang servers (``python -m sglang.launch_server``).

Each server runs in its own process group (stopping it also stops its scheduler and
detokenizer processes), logs to a file, and counts as started once ``GET /health``
answers 200. If the process exits first, the error quotes the end of its log.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import structlog

from slr.contracts import EngineUnavailable
from slr.errors import UsageError
from slr_engine_sglang.config import SglangEngineConfig

log = structlog.get_logger()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def launch_command(config: SglangEngineConfig, *, python: str, port: int) -> list[str]:
    """The ``launch_server`` command line for one server."""
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        config.model,
        "--host",
        config.host,
        "--port",
        str(port),
        "--served-model-name",
        config.served_model_name,
    ]
    if config.tokenizer:
        cmd += ["--tokenizer-path", config.tokenizer]
    if config.max_context:
        cmd += ["--context-length", str(config.max_context)]
    if config.return_routed_experts:
        cmd += ["--enable-return-routed-experts"]
    return cmd + list(config.extra_args)


def find_python(config: SglangEngineConfig) -> str:
    """The interpreter that launches the servers, or a ``UsageError`` saying what to set."""
    if not config.model:
        raise UsageError("[engine] model is empty: set the model for sglang.launch_server")
    python = shutil.which(config.python)
    if python is None:
        raise UsageError(
            f"{config.python!r} is not on PATH. Set [engine] python to the interpreter that "
            f"has SGLang installed (pip install sglang), or attach to running servers with "
            f"[engine] urls = ['http://host:port']"
        )
    return python


class SglangServer:
    """One launched SGLang server process."""

    def __init__(self, config: SglangEngineConfig, *, index: int = 0) -> None:
        python = find_python(config)
        self.config = config
        self.index = index
        port = config.base_port + index if config.base_port else free_port(config.host)
        self.url = f"http://{config.host}:{port}"
        self.command = launch_command(config, python=python, port=port)
        log_dir = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp("-sglang"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"sglang-{index}.log"
        env = dict(os.environ)
        if config.gpus_per_replica:
            env["CUDA_VISIBLE_DEVICES"] = config.gpus_per_replica[
                index % len(config.gpus_per_replica)
            ]
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.info(
            "sglang server launched", url=self.url, pid=self.process.pid, log=str(self.log_path)
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
                    f"sglang server {self.index} exited with code {self.process.returncode} "
                    f"before it was ready. Last log lines ({self.log_path}):\n{self.log_tail()}"
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
                    f"sglang server {self.index} was not healthy after {timeout_s:.0f}s; "
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
            # children that outlive the leader (or ignore SIGTERM) go with the group
            _signal_group(pgid, signal.SIGKILL)
        self._log.close()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
