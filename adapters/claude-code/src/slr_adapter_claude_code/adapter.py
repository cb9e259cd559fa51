"""Claude Code, headless (``claude -p``), pointed at the session's Anthropic endpoint."""

from __future__ import annotations

from attrs import frozen, validators

from slr.agents import bundles
from slr.agents.bundle_recipes import npm_packages
from slr.agents.headless import (
    AGENT_DIR,
    INSTRUCTION_ARG,
    anthropic_base_url,
    run_scaffold,
    shell_line,
)
from slr.config import option
from slr.contracts import AgentAdapter, AgentOutcome, Bundle, Endpoint, Sandbox


@frozen(kw_only=True)
class ClaudeCodeConfig:
    version: str = option("2.1.332", doc="Version of the npm package @anthropic-ai/claude-code.")
    tools: list[str] = option(
        factory=lambda: ["Bash", "Read", "Write", "Edit"],
        doc="Built-in tools offered to the model (--tools); empty offers all (~64k characters "
        "of tool schemas per call).",
    )
    max_turns: int = option(0, doc="Most agentic turns (--max-turns); 0 leaves it to Claude Code.")
    auto_compact: bool = option(
        True,
        doc="Claude Code's automatic compaction (on in Claude Code): near its context limit it "
        "summarises the conversation and goes on from the summary, which the proxy records as "
        "a rewrite segment. false sets DISABLE_AUTO_COMPACT=1.",
    )
    compact_window: int = option(
        0,
        doc="Context window, in tokens, that auto-compaction counts against "
        "(CLAUDE_CODE_AUTO_COMPACT_WINDOW); 0: Claude Code's own (200k for a model name it does "
        "not know, so a small policy overflows before it would compact).",
        validator=validators.ge(0),
    )
    compact_percent: int = option(
        0,
        doc="Percentage of that window at which it compacts (CLAUDE_AUTOCOMPACT_PCT_OVERRIDE; "
        "it can only lower Claude Code's threshold); 0: Claude Code's own.",
        validator=[validators.ge(0), validators.le(100)],
    )
    extra_args: list[str] = option(factory=list, doc="More command-line arguments for `claude`.")
    env: dict[str, str] = option(factory=dict, doc="More environment variables for `claude`.")


class ClaudeCode(AgentAdapter):
    """Claude Code speaks the Anthropic Messages API (streaming)."""

    protocol = "anthropic"

    def __init__(self, config: ClaudeCodeConfig | None = None) -> None:
        self.config = config or ClaudeCodeConfig()

    def bundle(self) -> Bundle:
        version = self.config.version
        return bundles.ensure(
            "claude-code",
            version,
            lambda step: _build(step, version),
        )

    def command(self, root: str, endpoint: Endpoint) -> tuple[str, dict[str, str]]:
        """The command line and environment that run it against ``endpoint``, with the
        bundle at ``root`` in the sandbox."""
        c = self.config
        argv = [
            f"{root}/node_modules/.bin/claude",
            "-p",
            "--output-format", "stream-json",
            "--verbose",
            "--model", endpoint.model,
            "--permission-mode", "bypassPermissions",
        ]  # fmt: skip
        if c.tools:
            argv += ["--tools", ",".join(c.tools)]
        if c.max_turns:
            argv += ["--max-turns", str(c.max_turns)]
        argv += c.extra_args
        command = shell_line(argv, "--", INSTRUCTION_ARG)
        env = {
            "ANTHROPIC_BASE_URL": anthropic_base_url(endpoint.base_url),
            "ANTHROPIC_API_KEY": endpoint.api_key,
            # Background calls (titles, summaries) would name Anthropic's models.
            "ANTHROPIC_SMALL_FAST_MODEL": endpoint.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": endpoint.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": endpoint.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # bypassPermissions is refused to root unless it knows it is sandboxed.
            "IS_SANDBOX": "1",
            # Its state and session transcripts, kept apart from the task's HOME.
            "CLAUDE_CONFIG_DIR": f"{AGENT_DIR}/claude",
            **compaction_env(c),
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
            logs_from=[f"{AGENT_DIR}/claude/projects"],
        )


def compaction_env(c: ClaudeCodeConfig) -> dict[str, str]:
    """The environment that sets Claude Code's context management (nothing: its defaults)."""
    env: dict[str, str] = {}
    if not c.auto_compact:
        env["DISABLE_AUTO_COMPACT"] = "1"
    if c.compact_window:
        env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(c.compact_window)
    if c.compact_percent:
        env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] = str(c.compact_percent)
    return env


def _build(step: bundles.BuildStep, version: str) -> None:
    npm_packages(step, [f"@anthropic-ai/claude-code@{version}"])
    # The package's postinstall puts the native binary in place; check that it did.
    step.run([step.path / "node_modules" / ".bin" / "claude", "--version"])
