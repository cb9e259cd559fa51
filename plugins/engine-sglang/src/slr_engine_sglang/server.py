"""The SGLang server command line (``python -m sglang.launch_server``) and launch of one
server (``slr.engines.server`` runs the process: its log file, health wait and
process-group stop)."""

from __future__ import annotations

import shutil

from slr.engines.server import ServerProcess, replica_env, server_port
from slr.errors import UsageError
from slr_engine_sglang.config import SglangEngineConfig


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
    if config.max_lora_rank:  # adapters are loaded at run time: shape the pool up front
        cmd += ["--enable-lora", "--max-lora-rank", str(config.max_lora_rank)]
        cmd += ["--lora-target-modules", *(config.lora_target_modules or ["all"])]
        cmd += ["--max-loras-per-batch", str(config.max_loras_per_batch)]
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


def launch_server(config: SglangEngineConfig, *, index: int = 0) -> ServerProcess:
    """Launch SGLang for replica ``index``; a ``UsageError`` when it cannot start."""
    python = find_python(config)
    port = server_port(config.host, base_port=config.base_port, index=index)
    return ServerProcess(
        launch_command(config, python=python, port=port),
        kind="sglang",
        url=f"http://{config.host}:{port}",
        index=index,
        log_dir=config.log_dir,
        env=replica_env(config.gpus_per_replica, index),
    )
