"""Launching and stopping ``vllm serve`` processes.

Each server runs in its own process group (so stopping it also stops its workers), logs
to a file, and counts as started once ``GET /health`` answers 200. If the process exits
first, the error quotes the end of its log.
"""

from __future__ import annotations

import asyncio
import json
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
from slr_engine_vllm.config import VllmEngineConfig

log = structlog.get_logger()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def serve_command(
    config: VllmEngineConfig, *, executable: str, port: int, max_context: int
) -> list[str]:
    """The ``vllm serve`` command line for one server."""
    cmd = [
        executable,
        "serve",
        config.model,
        "--host",
        config.host,
        "--port",
        str(port),
        "--served-model-name",
        config.served_model_name,
        # log-probs after temperature: the definition the trainer uses (see protocol.py)
        "--logprobs-mode",
        "processed_logprobs",
    ]
    if max_context:
        cmd += ["--max-model-len", str(max_context)]
    if config.return_routed_experts:
        cmd += ["--enable-return-routed-experts"]
    if config.weight_transfer == "nccl":
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    if config.max_lora_rank:
        cmd += ["--enable-lora", "--max-lora-rank", str(config.max_lora_rank), "--max-loras", "1"]
    return cmd + list(config.extra_args)


class VllmServer:
    """One launched ``vllm serve`` process."""

    def __init__(self, config: VllmEngineConfig, *, index: int = 0) -> None:
        if not config.model:
            raise UsageError("[engine] model is empty: set the model for `vllm serve`")
        executable = shutil.which(config.executable)
        if executable is None:
            raise UsageError(
                f"{config.executable!r} is not on PATH. Install vLLM on this machine "
                f"(pip install vllm), set [engine] executable, or attach to running "
                f"servers with [engine] urls = ['http://host:port']"
            )
        self.config = config
        self.index = index
        port = config.base_port + index if config.base_port else free_port(config.host)
        self.url = f"http://{config.host}:{port}"
        self.command = serve_command(
            config, executable=executable, port=port, max_context=config.max_context
        )
        log_dir = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp("-vllm"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"vllm-{index}.log"
        env = dict(os.environ)
        # the pause / weight-transfer endpoints are only served in dev mode
        env["VLLM_SERVER_DEV_MODE"] = "1"
        if config.max_lora_rank:  # /v1/load_lora_adapter is served only with this set
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
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
        log.info("vllm server launched", url=self.url, pid=self.process.pid, log=str(self.log_path))

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
                    f"vllm server {self.index} exited with code {self.process.returncode} "
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
                    f"vllm server {self.index} was not healthy after {timeout_s:.0f}s; "
                    f"last log lines ({self.log_path}):\n{self.log_tail()}"
                )
            # a readiness poll with backoff: the server offers no push notification
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the server's process group; SIGKILL what is left after ``grace_s``."""
        if self.running:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait(10)
            # Workers that outlive the leader (or ignore SIGTERM) go with the group.
            pgid = self.process.pid
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _wait_group_gone(pgid, timeout_s=10.0)
        self._log.close()


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
