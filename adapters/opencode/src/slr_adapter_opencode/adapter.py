"""OpenCode, headless (``opencode run``), with the session endpoint as its only provider."""

from __future__ import annotations

import json

from attrs import frozen

from slr.agents import bundles
from slr.agents.bundle_recipes import npm_packages
from slr.agents.headless import (
    AGENT_DIR,
    INSTRUCTION_ARG,
    openai_base_url,
    run_scaffold,
    shell_line,
)
from slr.config import option
from slr.contracts import AgentAdapter, AgentOutcome, Bundle, Endpoint, Sandbox

PROVIDER = "slr"


@frozen(kw_only=True)
class OpenCodeConfig:
    version: str = option("1.18.33", doc="Version of the npm package opencode-ai.")
    tools: dict[str, bool] = option(
        factory=lambda: {"webfetch": False, "websearch": False, "todowrite": False, "task": False},
        doc="Tools to switch on or off by name (OpenCode's `tools` config); the rest keep "
        "OpenCode's defaults. Web tools are off: sandboxes have no internet.",
    )
    context_tokens: int = option(8192, doc="Context window OpenCode is told the model has.")
    output_tokens: int = option(1024, doc="Most tokens OpenCode asks for per call.")
    max_steps: int = option(
        0, doc="Most agentic steps of its `build` agent (`agent.build.steps`); 0: its default."
    )
    auto_compact: bool = option(
        True,
        doc="OpenCode's automatic compaction (`compaction.auto`, on in OpenCode): when a "
        "call would overflow context_tokens it summarises the session and goes on from the "
        "summary (a rewrite segment).",
    )
    prune: bool = option(
        False,
        doc="OpenCode's pruning of old tool outputs (`compaction.prune`, off in OpenCode): "
        "it rewrites earlier turns, so each prune starts a new segment.",
    )
    extra_args: list[str] = option(factory=list, doc="More arguments for `opencode run`.")
    env: dict[str, str] = option(factory=dict, doc="More environment variables for OpenCode.")


class OpenCode(AgentAdapter):
    """OpenCode speaks OpenAI Chat Completions (always streaming, tool-call deltas)."""

    protocol = "openai"

    def __init__(self, config: OpenCodeConfig | None = None) -> None:
        self.config = config or OpenCodeConfig()

    def bundle(self) -> Bundle:
        version = self.config.version
        return bundles.ensure("opencode", version, lambda step: _build(step, version))

    def opencode_config(self, endpoint: Endpoint) -> dict:
        """OpenCode's own config (``OPENCODE_CONFIG_CONTENT``): one provider, the session."""
        c = self.config
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "slr session",
                    "options": {
                        "baseURL": openai_base_url(endpoint.base_url),
                        "apiKey": endpoint.api_key,
                    },
                    "models": {
                        endpoint.model: {
                            "name": endpoint.model,
                            "tool_call": True,
                            "limit": {"context": c.context_tokens, "output": c.output_tokens},
                        }
                    },
                }
            },
            "model": f"{PROVIDER}/{endpoint.model}",
            "small_model": f"{PROVIDER}/{endpoint.model}",
            "enabled_providers": [PROVIDER],
            "autoupdate": False,
            "share": "disabled",
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
            "tools": dict(c.tools),
            "compaction": {"auto": c.auto_compact, "prune": c.prune},
            **({"agent": {"build": {"steps": c.max_steps}}} if c.max_steps else {}),
        }

    def command(self, root: str, endpoint: Endpoint) -> tuple[str, dict[str, str]]:
        """The command line and environment, with the bundle at ``root`` in the sandbox."""
        c = self.config
        argv = [
            f"{root}/node_modules/.bin/opencode",
            "run",
            "--format", "json",
            # Without a title OpenCode spends a model call on naming the session.
            "--title", "slr",
            "--model", f"{PROVIDER}/{endpoint.model}",
            *c.extra_args,
        ]  # fmt: skip
        command = shell_line(argv, "--", INSTRUCTION_ARG)
        xdg = f"{AGENT_DIR}/xdg"
        env = {
            "OPENCODE_CONFIG_CONTENT": json.dumps(self.opencode_config(endpoint)),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            # Its data (sessions, logs) and caches, kept apart from the task's HOME.
            "XDG_DATA_HOME": f"{xdg}/data",
            "XDG_CONFIG_HOME": f"{xdg}/config",
            "XDG_STATE_HOME": f"{xdg}/state",
            "XDG_CACHE_HOME": f"{xdg}/cache",
            **c.env,
        }
        return command, env

    async def run(
        self, sandbox: Sandbox, instruction: str, endpoint: Endpoint, *, timeout_s: float
    ) -> AgentOutcome:
        return await run_scaffold(
            self,
            sandbox,
            instruction,
            endpoint,
            timeout_s=timeout_s,
            logs_from=[
                f"{AGENT_DIR}/xdg/data/opencode/log",
                f"{AGENT_DIR}/xdg/data/opencode/storage",
            ],
        )


def _build(step: bundles.BuildStep, version: str) -> None:
    npm_packages(step, [f"opencode-ai@{version}"])
    step.run([step.path / "node_modules" / ".bin" / "opencode", "--version"])
