"""mini-swe-agent, headless (``mini -y --exit-immediately``), its litellm model pointed at
the session's OpenAI endpoint."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Literal

from attrs import frozen, validators

from slr.agents import bundles
from slr.agents.bundle_recipes import (
    python_bin,
    python_bundle_version,
    python_env,
    python_packages,
)
from slr.agents.headless import AGENT_DIR, openai_base_url, run_scaffold
from slr.config import option
from slr.contracts import AgentAdapter, AgentOutcome, Bundle, Endpoint, Sandbox
from slr.errors import UsageError

# mini's own configs: actions as fenced bash blocks in the text, or as `bash` tool calls.
_CONFIGS = {"textbased": "mini_textbased.yaml", "tool_calls": "mini.yaml"}
# mini's model class per client and action format (``model.model_class``).
_MODEL_CLASSES = {
    ("litellm", "textbased"): "litellm_textbased",
    ("litellm", "tool_calls"): "litellm",
    ("requests", "textbased"): "slr_mini_model.DirectTextbasedModel",
    ("requests", "tool_calls"): "slr_mini_model.DirectModel",
}
# Where ``direct_model.py`` goes in the sandbox (on mini's PYTHONPATH), as ``slr_mini_model``.
_MODEL_MODULE = "mini/slr_mini_model.py"


_USER_CONFIG = "mini/config.yaml"


def _read_config(path: str) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(
            f"agent.config_file = {path!r} cannot be read ({exc.strerror}); give the path of "
            f"a mini-swe-agent YAML config, relative to the directory slr runs in"
        ) from None


@frozen(kw_only=True)
class MiniSweAgentConfig:
    version: str = option("2.4.6", doc="Version of the PyPI package mini-swe-agent.")
    action_format: Literal["textbased", "tool_calls"] = option(
        "textbased",
        doc="How the model gives its action: one fenced bash block per reply (mini's "
        "mini_textbased.yaml) or a `bash` tool call (mini.yaml).",
    )
    step_limit: int = option(
        30,
        doc="Most model calls per trial (agent.step_limit; 0: no limit).",
        validator=validators.ge(0),
    )
    config_file: str = option(
        "",
        doc="A mini-swe-agent YAML config (a path on the host) merged over the built-in one "
        "that `action_format` picks, e.g. a shorter system / instance template or another "
        "`model.action_regex`. Relative paths are read from the current directory.",
    )
    client: Literal["requests", "litellm"] = option(
        "requests",
        doc="How mini calls the model. 'requests': mini's own OpenRouter model classes "
        "(plain `requests`) pointed at the session's endpoint by a small subclass this "
        "adapter ships; start-up skips importing litellm (~5 CPU-seconds per trial). "
        "'litellm': mini's default litellm classes.",
    )
    model_timeout_s: float = option(
        3600.0,
        doc="With client = 'requests': how long one model call may take before mini retries "
        "it (the agent timeout still ends the trial).",
        validator=validators.gt(0),
    )
    python: str = option("3.12", doc="Python version of the bundle's interpreter.")
    config_overrides: list[str] = option(
        factory=list, doc="More `-c key=value` overrides for mini, e.g. 'agent.cost_limit=0'."
    )
    env: dict[str, str] = option(factory=dict, doc="More environment variables for mini.")


class MiniSweAgent(AgentAdapter):
    """mini-swe-agent speaks OpenAI Chat Completions (non-streaming) through litellm."""

    protocol = "openai"

    def __init__(self, config: MiniSweAgentConfig | None = None) -> None:
        self.config = config or MiniSweAgentConfig()
        self.config_text = _read_config(self.config.config_file)

    def bundle(self) -> Bundle:
        c = self.config
        return bundles.ensure(
            "mini-swe-agent",
            python_bundle_version(c.version, c.python),
            lambda step: python_packages(step, [f"mini-swe-agent=={c.version}"], version=c.python),
        )

    def command(self, root: str, endpoint: Endpoint) -> tuple[str, dict[str, str]]:
        """The command line and environment, with the bundle at ``root`` in the sandbox."""
        c = self.config
        config_file = _CONFIGS[c.action_format]
        base_url = openai_base_url(endpoint.base_url)
        if c.client == "litellm":
            client = [
                f"model.model_kwargs.api_base={base_url}",
                f"model.model_kwargs.api_key={endpoint.api_key}",
            ]
            # litellm's provider prefix: an OpenAI-compatible server
            model = f"openai/{endpoint.model}"
        else:
            client = [
                f"model.api_base={base_url}",
                f"model.api_key={endpoint.api_key}",
                f"model.timeout_s={c.model_timeout_s}",
            ]
            model = endpoint.model
        overrides = [
            f"model.model_class={_MODEL_CLASSES[c.client, c.action_format]}",
            *client,
            f"agent.step_limit={c.step_limit}",
            # litellm prices no local model; cost limits cannot apply
            "agent.cost_limit=0",
            *c.config_overrides,
        ]
        # mini's own CLI, run as a module: console scripts would name the build folder
        argv = [python_bin(root, c.python), "-m", "minisweagent.run.mini", "-c", config_file]
        if self.config_text is not None:
            argv += ["-c", f"{AGENT_DIR}/{_USER_CONFIG}"]
        for o in overrides:
            argv += ["-c", o]
        argv += [
            "--model", model,
            "--yolo", "--exit-immediately",
            "--output", f"{AGENT_DIR}/mini/trajectory.json",
        ]  # fmt: skip
        command = (
            " ".join(shlex.quote(a) for a in argv)
            + f' --task "$(cat {AGENT_DIR}/instruction.md)" </dev/null'
        )
        env = {
            **python_env(root),
            # its model calls go through litellm: the price list is read locally, not fetched
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONPATH": f"{AGENT_DIR}/mini",  # slr_mini_model (client = 'requests')
            "MSWEA_CONFIGURED": "true",  # skip the first-run setup prompt
            "MSWEA_GLOBAL_CONFIG_DIR": f"{AGENT_DIR}/mini",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_SILENT_STARTUP": "1",
            # TERM unset makes rich print plain text into the logs
            "TERM": "dumb",
            **c.env,
        }
        return command, env

    def _files(self) -> dict[str, str]:
        from importlib.resources import files

        out = {}
        if self.config.client == "requests":
            module = files("slr_adapter_mini_swe_agent").joinpath("direct_model.py").read_text()
            out[_MODEL_MODULE] = module
        if self.config_text is not None:
            out[_USER_CONFIG] = self.config_text
        return out

    async def run(
        self, sandbox: Sandbox, instruction: str, endpoint: Endpoint, *, timeout_s: float
    ) -> AgentOutcome:
        return await run_scaffold(
            self,
            sandbox,
            instruction,
            endpoint,
            timeout_s=timeout_s,
            files=self._files(),
            python=True,
            logs_from=[f"{AGENT_DIR}/mini/trajectory.json"],
        )
