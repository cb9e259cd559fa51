"""The OpenHands SDK agent, run inside the sandbox on the bundle's Python."""

from __future__ import annotations

import asyncio
from typing import Any

from attrs import frozen, validators

from slr.agents import bundles
from slr.agents.bundle_recipes import (
    host_tool,
    python_bin,
    python_bundle_version,
    python_env,
    python_packages,
)
from slr.agents.headless import (
    AGENT_DIR,
    bundle_root,
    driver_command,
    driver_files,
    openai_base_url,
    run_scaffold,
)
from slr.agents.prestart import Prestarted, start_interpreter, take
from slr.agents.prestart_main import FREEZE_IMPORTS_ENV
from slr.agents.tmux import ENV as TMUX_ENV
from slr.agents.tmux import end_tmux, with_tmux
from slr.config import option
from slr.contracts import AgentAdapter, AgentOutcome, Bundle, Endpoint, Sandbox


def _leaves_room_to_condense(instance: Any, attribute: Any, value: int) -> None:
    # OpenHands refuses a condenser with nothing between its kept head and its tail
    if instance.condenser and value >= instance.condenser_max_events // 2 - 1:
        raise ValueError(
            f"agent.condenser_keep_first = {value} leaves nothing to condense with "
            f"condenser_max_events = {instance.condenser_max_events}; keep it under "
            f"{instance.condenser_max_events // 2 - 1} or raise condenser_max_events"
        )


@frozen(kw_only=True)
class OpenHandsConfig:
    version: str = option(
        "1.58.2", doc="Version of the PyPI packages openhands-sdk and openhands-tools."
    )
    tools: list[str] = option(
        factory=lambda: ["terminal", "file_editor", "task_tracker"],
        doc="OpenHands tools offered to the model: terminal, file_editor, task_tracker.",
    )
    max_iterations: int = option(
        30, doc="Most agent steps per trial (max_iteration_per_run).", validator=validators.ge(1)
    )
    context_tokens: int = option(8192, doc="Context window OpenHands is told the model has.")
    output_tokens: int = option(1024, doc="Most tokens per model call.")
    allow_short_context: bool = option(
        True,
        doc="Let OpenHands run with a context window under its 16k minimum "
        "(ALLOW_SHORT_CONTEXT_WINDOWS); small policies (SmolLM2: 8k) need it.",
    )
    condenser: bool = option(
        True,
        doc="OpenHands' context condenser (LLMSummarizingCondenser, as its default agent "
        "has): past condenser_max_events events, or near context_tokens, the older events "
        "are summarised by the same model (a side call: a fork) and replaced by the summary "
        "(a rewrite segment). false: the agent keeps its whole history.",
    )
    condenser_max_events: int = option(
        80,
        doc="Events the history may hold before it is condensed (its max_size; OpenHands' "
        "default agent uses 80).",
        validator=validators.ge(4),
    )
    condenser_keep_first: int = option(
        4,
        doc="Leading events never condensed (its keep_first; OpenHands' default agent uses "
        "4); must be under condenser_max_events / 2 - 1.",
        validator=[validators.ge(0), _leaves_room_to_condense],
    )
    python: str = option("3.12", doc="Python version of the bundle's interpreter (>= 3.12).")
    env: dict[str, str] = option(factory=dict, doc="More environment variables for the agent.")
    prestart: bool = option(
        True,
        doc="With a warm pool ([rollout] pool_size > 0): start the SDK's Python in each "
        "pooled sandbox ahead of its trial, the SDK (and litellm) imported, so the trial's "
        "agent reaches its first model call without paying the import. The CPU is still "
        "the trial's (costs.cpu_s.sandbox_start). No effect without a pool.",
    )
    freeze_imports: bool = option(
        True,
        doc="Import the SDK with Python's cyclic garbage collector paused, then freeze "
        "what the import made (gc.freeze), in the trial's interpreter or the prestarted "
        "one: about a fifth less start-up CPU, and the trial's later full collections skip "
        "the import's objects. Python's own setting, the scaffold unchanged; false: "
        "Python's default (the collector runs during the import).",
    )


class OpenHands(AgentAdapter):
    """OpenHands speaks OpenAI Chat Completions (non-streaming, native tool calls) via litellm."""

    protocol = "openai"

    def __init__(self, config: OpenHandsConfig | None = None) -> None:
        self.config = config or OpenHandsConfig()

    def bundle(self) -> Bundle:
        c = self.config
        return bundles.ensure(
            "openhands", python_bundle_version(c.version, c.python), lambda step: _build(step, c)
        )

    def settings(self, endpoint: Endpoint) -> dict:
        c = self.config
        return {
            "model": f"openai/{endpoint.model}",
            "base_url": openai_base_url(endpoint.base_url),
            "tools": list(c.tools),
            "max_iterations": c.max_iterations,
            "max_input_tokens": c.context_tokens,
            "max_output_tokens": c.output_tokens,
            "condenser": (
                {"max_size": c.condenser_max_events, "keep_first": c.condenser_keep_first}
                if c.condenser
                else None
            ),
            "persistence_dir": f"{AGENT_DIR}/openhands",
            "instruction_file": f"{AGENT_DIR}/instruction.md",
        }

    def _env(self, root: str) -> dict[str, str]:
        """The driver's environment, less the session's key."""
        return {
            **python_env(root),
            # its model calls go through litellm: the price list is read locally, not fetched
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            **TMUX_ENV,
            **({FREEZE_IMPORTS_ENV: "1"} if self.config.freeze_imports else {}),
            **({"ALLOW_SHORT_CONTEXT_WINDOWS": "true"} if self.config.allow_short_context else {}),
            **self.config.env,
        }

    def command(self, root: str, endpoint: Endpoint) -> tuple[str, dict[str, str]]:
        """The command line and environment, with the bundle at ``root`` in the sandbox."""
        # The key travels in the environment, not in a file the agent could read back.
        env = {**self._env(root), "SLR_OPENHANDS_API_KEY": endpoint.api_key, **self.config.env}
        return with_tmux(root, driver_command(python_bin(root, self.config.python))), env

    async def prestart(self, sandbox: Sandbox) -> Prestarted | None:
        """In a pooled sandbox, before its trial: the driver's Python with the SDK imported
        (``slr.agents.prestart``); ``run`` hands it the trial."""
        if not self.config.prestart:
            return None
        from slr_adapter_openhands.driver import PRELOAD

        root = await bundle_root(sandbox, await asyncio.to_thread(self.bundle))
        return await start_interpreter(
            sandbox,
            python=python_bin(root, self.config.python),
            modules=PRELOAD,
            env=self._env(root),
            wrap=lambda line: with_tmux(root, line),
        )

    async def run(
        self, sandbox: Sandbox, instruction: str, endpoint: Endpoint, *, timeout_s: float
    ) -> AgentOutcome:
        return await run_scaffold(
            self,
            sandbox,
            instruction,
            endpoint,
            timeout_s=timeout_s,
            python=True,
            cleanup=end_tmux,  # its terminal tool
            files=driver_files("slr_adapter_openhands", self.settings(endpoint)),
            logs_from=[f"{AGENT_DIR}/openhands"],
            prestarted=take(sandbox),
        )


def _build(step: bundles.BuildStep, c: OpenHandsConfig) -> None:
    python_packages(
        step, [f"openhands-sdk=={c.version}", f"openhands-tools=={c.version}"], version=c.python
    )
    host_tool(step, "tmux", hint="install tmux on the host (apt-get install tmux)")
