"""Runs harbor's Terminus-2, unmodified, inside the sandbox it is to work in.

Harbor drives Terminus-2 from outside a container through a ``BaseEnvironment``. Here the
driver runs inside the sandbox (on the bundle's Python), so its environment is this
machine: commands run as local subprocesses, files are local copies. Only the members
Terminus-2 and its tmux session use are provided.

Usage: python driver.py SETTINGS_JSON   (written by the slr adapter)
"""

import asyncio
import gc
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

#: What ``main`` and ``ThisMachine`` import, then (``?``: optional) what litellm imports
#: lazily on the way to the first model call (seen with harbor 0.26.0): a prestarted
#: interpreter (slr.agents.prestart) imports these ahead.
PRELOAD = (
    "harbor.agents.terminus_2.terminus_2",
    "harbor.environments.base",
    "harbor.models.agent.context",
    "?litellm.litellm_core_utils.default_encoding",
    "?litellm.litellm_core_utils.duration_parser",
    "?litellm.litellm_core_utils.logging_callback_manager",
    "?litellm.integrations.generic_api",
    "?litellm.llms.github_copilot.authenticator",
    "?litellm.llms.github_copilot.github_host",
    "?litellm.llms.github_copilot.per_user_auth",
    "?litellm.llms.litellm_proxy.chat.transformation",
    "?litellm.llms.openai.chat.gpt_audio_transformation",
    "?litellm.llms.openai_like.dynamic_config",
    "?litellm.proxy._types",
    "?litellm.proxy.common_utils",
    "?litellm.proxy.mcp_server",
    "?litellm.proxy.openai_files_endpoints.common_utils",
    "?litellm.proxy.types_utils",
    "?tiktoken.load",
    "?tiktoken_ext.openai_public",
)


class ThisMachine:
    """The sandbox itself, in the shape of the harbor environment Terminus-2 talks to."""

    def __init__(self, agent_dir: Path, workdir: str) -> None:
        self.default_user = None
        self.session_id = "slr"
        self.trial_paths = SimpleNamespace(agent_dir=agent_dir)
        self.workdir = workdir

    async def exec(self, command, cwd=None, env=None, timeout_sec=None, user=None):
        # harbor lives in the bundle's venv (Python >= 3.12), where this runs.
        from harbor.environments.base import ExecResult  # pyright: ignore[reportMissingImports]

        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command,
            cwd=cwd or self.workdir,
            env={**os.environ, **(env or {})},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_sec)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            return ExecResult(
                stdout=out.decode(errors="replace"), stderr="timed out", return_code=124
            )
        return ExecResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            return_code=proc.returncode,
        )

    async def is_dir(self, path, user=None):
        return Path(path).is_dir()

    async def upload_file(self, source_path, target_path):
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path, target_path)

    async def download_file(self, source_path, target_path):
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path, target_path)


async def main(settings: dict) -> int:
    # SLR_FREEZE_IMPORTS=1 (the adapter's freeze_imports): import with the cyclic garbage
    # collector paused, then freeze what the import made, as slr.agents.prestart_main's
    # frozen_imports does (this file runs without slr).
    freeze = os.environ.get("SLR_FREEZE_IMPORTS") == "1"
    if freeze:
        gc.disable()
    # harbor lives in the bundle's venv (Python >= 3.12), where this runs.
    from harbor.agents.terminus_2.terminus_2 import Terminus2  # pyright: ignore[reportMissingImports]
    from harbor.models.agent.context import AgentContext  # pyright: ignore[reportMissingImports]

    if freeze:
        gc.freeze()
        gc.enable()

    logs = Path(settings["logs_dir"])
    logs.mkdir(parents=True, exist_ok=True)
    agent = Terminus2(
        logs_dir=logs,
        model_name=settings["model_name"],
        api_base=settings["api_base"],
        max_turns=settings["max_turns"],
        temperature=settings.get("temperature"),
        enable_summarize=settings["enable_summarize"],
        proactive_summarization_threshold=settings["proactive_summarization_threshold"],
        record_terminal_session=False,
        model_info=settings["model_info"],
        suppress_max_turns_warning=True,
        **settings.get("extra_kwargs", {}),
    )
    machine = ThisMachine(logs, os.getcwd())
    context = AgentContext()
    await agent.setup(machine)
    await agent.run(Path(settings["instruction_file"]).read_text(), machine, context)
    (logs / "context.json").write_text(context.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(Path(sys.argv[1]).read_text()))))
