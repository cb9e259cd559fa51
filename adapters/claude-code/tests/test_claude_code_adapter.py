"""Claude Code, the real binary, through the adapter conformance suite."""

from __future__ import annotations

import pytest
from slr_adapter_claude_code.adapter import ClaudeCode, ClaudeCodeConfig

from slr.contracts import Endpoint
from slr_testkit import ScaffoldAdapterTests
from slr_testkit.scripted_policy import Reply, ToolCall


class TestClaudeCode(ScaffoldAdapterTests):
    @pytest.fixture(scope="class")
    @classmethod
    def adapter(cls):
        return ClaudeCode()

    @pytest.fixture(scope="class")
    @classmethod
    def hello_script(cls):
        return [
            Reply(tool_calls=[ToolCall(name="Bash", arguments={
                "command": "printf 'hello\\n' > hello.txt", "description": "write hello.txt"})]),
            Reply(text="Created hello.txt."),
        ]  # fmt: skip


def test_command_points_claude_at_the_endpoint():
    adapter = ClaudeCode(ClaudeCodeConfig(max_turns=3, extra_args=["--debug"]))
    command, env = adapter.command(
        "/b", Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    )
    assert command.startswith("/b/node_modules/.bin/claude -p --output-format stream-json")
    assert "--model m" in command and "--max-turns 3" in command and "--debug" in command
    assert "--tools Bash,Read,Write,Edit" in command
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert env["ANTHROPIC_API_KEY"] == "k"
    assert env["IS_SANDBOX"] == "1" and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


def test_auto_compaction_is_claude_codes_own_unless_configured():
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    _, env = ClaudeCode().command("/b", endpoint)
    assert not {"DISABLE_AUTO_COMPACT", "CLAUDE_CODE_AUTO_COMPACT_WINDOW"} & set(env)
    config = ClaudeCodeConfig(auto_compact=False, compact_window=8192, compact_percent=70)
    _, env = ClaudeCode(config).command("/b", endpoint)
    assert env["DISABLE_AUTO_COMPACT"] == "1"
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "8192"
    assert env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "70"
    with pytest.raises(ValueError, match="compact_percent"):
        ClaudeCodeConfig(compact_percent=120)
