"""Runs an OpenHands SDK agent, unmodified, inside the sandbox it is to work in.

This is the SDK's documented headless use (LLM -> Agent with tools -> Conversation on a
local workspace -> send_message -> run), with its settings from a file written by the slr
adapter. The API key comes from the environment.

Usage: python driver.py SETTINGS_JSON
"""

import gc
import json
import os
import sys
from pathlib import Path

#: What ``main`` imports, then (``?``: optional) what the SDK, litellm and openai import
#: lazily on the way to the first model call (seen with openhands-sdk 1.58.2): a prestarted
#: interpreter (slr.agents.prestart) imports these ahead.
PRELOAD = (
    "openhands.sdk",
    "openhands.sdk.context.condenser",
    "openhands.tools.file_editor",
    "openhands.tools.task_tracker",
    "openhands.tools.terminal",
    "pydantic",
    "?openhands.sdk.llm.provider_connection_store",
    "?openai.resources",
    "?openai.lib.streaming.chat",
    "?openai.types.chat.completions",
    "?litellm.litellm_core_utils.default_encoding",
    "?litellm.llms.litellm_proxy.chat",
    "?litellm.llms.openai.chat.gpt_audio_transformation",
    "?litellm.llms.openai_like.dynamic_config",
    "?litellm.llms.vertex_ai.vertex_ai_partner_models.anthropic",
    "?litellm.proxy._experimental.mcp_server.utils",
    "?litellm.proxy.openai_files_endpoints.common_utils",
    "?litellm.responses.mcp.chat_completions_handler",
    "?litellm.responses.mcp.litellm_proxy_mcp_handler",
    "?httpcore",
    "?h11",
    "?h2.connection",
    "?jiter",
    "?tiktoken.load",
    "?tiktoken_ext.openai_public",
)


def main(settings: dict) -> int:
    # SLR_FREEZE_IMPORTS=1 (the adapter's freeze_imports): import with the cyclic garbage
    # collector paused, then freeze what the import made, as slr.agents.prestart_main's
    # frozen_imports does (this file runs without slr).
    freeze = os.environ.get("SLR_FREEZE_IMPORTS") == "1"
    if freeze:
        gc.disable()
    # The SDK lives in the bundle's venv (Python >= 3.12), where this runs, not the dev venv.
    from openhands.sdk import LLM, Agent, Conversation, Tool  # pyright: ignore[reportMissingImports]
    from openhands.tools.file_editor import FileEditorTool  # pyright: ignore[reportMissingImports]
    from openhands.tools.task_tracker import TaskTrackerTool  # pyright: ignore[reportMissingImports]
    from openhands.tools.terminal import TerminalTool  # pyright: ignore[reportMissingImports]
    from pydantic import SecretStr

    if freeze:
        gc.freeze()
        gc.enable()
    known = {t.name: t for t in (TerminalTool, FileEditorTool, TaskTrackerTool)}
    unknown = sorted(set(settings["tools"]) - set(known))
    if unknown:
        print(f"unknown OpenHands tools {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    llm = LLM(
        usage_id="agent",
        model=settings["model"],
        base_url=settings["base_url"],
        api_key=SecretStr(os.environ["SLR_OPENHANDS_API_KEY"]),
        max_input_tokens=settings["max_input_tokens"],
        max_output_tokens=settings["max_output_tokens"],
        native_tool_calling=True,
    )
    condenser = None
    if settings.get("condenser"):
        from openhands.sdk.context.condenser import (  # pyright: ignore[reportMissingImports]
            LLMSummarizingCondenser,
        )

        # as OpenHands' default agent does: the same model, under its own usage id
        condenser = LLMSummarizingCondenser(
            llm=llm.model_copy(update={"usage_id": "condenser"}), **settings["condenser"]
        )
    agent = Agent(
        llm=llm,
        tools=[Tool(name=known[name].name) for name in settings["tools"]],
        condenser=condenser,
    )
    conversation = Conversation(
        agent=agent,
        workspace=os.getcwd(),
        persistence_dir=settings["persistence_dir"],
        max_iteration_per_run=settings["max_iterations"],
    )
    conversation.send_message(Path(settings["instruction_file"]).read_text())
    conversation.run()
    status = conversation.state.execution_status
    print(json.dumps({"execution_status": str(status)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(Path(sys.argv[1]).read_text())))
