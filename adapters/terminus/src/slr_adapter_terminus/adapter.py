"""Terminus-2 (harbor's terminal agent), run inside the sandbox on the bundle's Python."""

from __future__ import annotations

import asyncio

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


@frozen(kw_only=True)
class TerminusConfig:
    version: str = option("0.26.0", doc="Version of the PyPI package harbor (ships Terminus-2).")
    max_turns: int = option(
        30, doc="Most episodes (model calls) per trial.", validator=validators.ge(1)
    )
    context_tokens: int = option(8192, doc="Context window Terminus-2 is told the model has.")
    output_tokens: int = option(1024, doc="Most tokens per model call.")
    enable_summarize: bool = option(
        True,
        doc="Terminus-2's summarisation (on in harbor): when the context fills up, helper "
        "calls (their own conversations: forks) summarise the history and the agent goes on "
        "from the summary (a rewrite segment).",
    )
    summarize_free_tokens: int = option(
        2048,
        doc="Summarise proactively once fewer tokens than this are left of context_tokens "
        "(harbor's proactive_summarization_threshold; 0: only on an overflow). harbor's own "
        "8000 would summarise before every call in an 8k window.",
        validator=validators.ge(0),
    )
    python: str = option("3.12", doc="Python version of the bundle's interpreter (>= 3.12).")
    extra_kwargs: dict[str, object] = option(
        factory=dict, doc="More keyword arguments for harbor's Terminus2(...)."
    )
    env: dict[str, str] = option(factory=dict, doc="More environment variables for the agent.")
    prestart: bool = option(
        True,
        doc="With a warm pool ([rollout] pool_size > 0): start harbor's Python in each "
        "pooled sandbox ahead of its trial, Terminus-2 (and litellm) imported, so the "
        "trial's agent reaches its first model call without paying the import. The CPU is "
        "still the trial's (costs.cpu_s.sandbox_start). No effect without a pool.",
    )
    freeze_imports: bool = option(
        True,
        doc="Import harbor with Python's cyclic garbage collector paused, then freeze "
        "what the import made (gc.freeze), in the trial's interpreter or the prestarted "
        "one: about a fifth less start-up CPU, and the trial's later full collections skip "
        "the import's objects. Python's own setting, the scaffold unchanged; false: "
        "Python's default (the collector runs during the import).",
    )


class Terminus(AgentAdapter):
    """Terminus-2 speaks OpenAI Chat Completions (non-streaming) through litellm; its
    actions are JSON keystrokes sent to a tmux session."""

    protocol = "openai"

    def __init__(self, config: TerminusConfig | None = None) -> None:
        self.config = config or TerminusConfig()

    def bundle(self) -> Bundle:
        c = self.config
        return bundles.ensure(
            "terminus", python_bundle_version(c.version, c.python), lambda step: _build(step, c)
        )

    def settings(self, endpoint: Endpoint) -> dict:
        c = self.config
        return {
            "model_name": f"openai/{endpoint.model}",
            "api_base": openai_base_url(endpoint.base_url),
            "max_turns": c.max_turns,
            "enable_summarize": c.enable_summarize,
            "proactive_summarization_threshold": c.summarize_free_tokens,
            "model_info": {
                "max_input_tokens": c.context_tokens,
                "max_output_tokens": c.output_tokens,
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
            },
            "logs_dir": f"{AGENT_DIR}/terminus",
            "instruction_file": f"{AGENT_DIR}/instruction.md",
            "extra_kwargs": dict(c.extra_kwargs),
        }

    def _env(self, root: str) -> dict[str, str]:
        """The driver's environment, less the session's key."""
        return {
            **python_env(root),
            # its model calls go through litellm: the price list is read locally, not fetched
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            **TMUX_ENV,
            **({FREEZE_IMPORTS_ENV: "1"} if self.config.freeze_imports else {}),
            **self.config.env,
        }

    def command(self, root: str, endpoint: Endpoint) -> tuple[str, dict[str, str]]:
        """The command line and environment, with the bundle at ``root`` in the sandbox."""
        env = {**self._env(root), "OPENAI_API_KEY": endpoint.api_key, **self.config.env}
        return with_tmux(root, driver_command(python_bin(root, self.config.python))), env

    async def prestart(self, sandbox: Sandbox) -> Prestarted | None:
        """In a pooled sandbox, before its trial: the driver's Python with Terminus-2
        imported (``slr.agents.prestart``); ``run`` hands it the trial."""
        if not self.config.prestart:
            return None
        from slr_adapter_terminus.driver import PRELOAD

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
            cleanup=end_tmux,  # it types its commands into a tmux session
            files=driver_files("slr_adapter_terminus", self.settings(endpoint)),
            logs_from=[f"{AGENT_DIR}/terminus"],
            prestarted=take(sandbox),
        )


def _build(step: bundles.BuildStep, c: TerminusConfig) -> None:
    python_packages(step, [f"harbor=={c.version}"], version=c.python)
    host_tool(step, "tmux", hint="install tmux on the host (apt-get install tmux)")
