"""The OpenHands SDK, the real packages, through the adapter conformance suite."""

from __future__ import annotations

import pytest
from slr_adapter_openhands.adapter import OpenHands, OpenHandsConfig

from slr.contracts import Endpoint
from slr_testkit import PrestartingAdapterTests, ScaffoldAdapterTests
from slr_testkit.scripted_policy import Reply, ToolCall


class TestOpenHands(ScaffoldAdapterTests, PrestartingAdapterTests):
    @pytest.fixture(scope="class")
    @classmethod
    def adapter(cls):
        return OpenHands()

    @pytest.fixture(scope="class")
    @classmethod
    def hello_script(cls):
        return [
            Reply(tool_calls=[ToolCall(name="terminal", arguments={
                "command": "printf 'hello\\n' > hello.txt", "summary": "write hello.txt"})]),
            Reply(tool_calls=[ToolCall(name="finish", arguments={"message": "Created hello.txt."})]),
        ]  # fmt: skip


def test_settings_point_litellm_at_the_endpoint():
    settings = OpenHands().settings(Endpoint(base_url="http://127.0.0.1:9", api_key="k", model="m"))
    assert settings["model"] == "openai/m" and settings["base_url"] == "http://127.0.0.1:9/v1"
    assert settings["tools"] == ["terminal", "file_editor", "task_tracker"]
    assert "sk-distinct-key" not in str(settings)  # the key travels in the environment only


def test_command_brings_its_own_tmux_and_litellm_offline_and_ends_tmux_after():
    from slr.agents.tmux import TMUX_TMPDIR, end_tmux

    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    command, env = OpenHands().command("/b", endpoint)
    # the bundle's tmux after the image's own, a socket folder of its own
    assert command.startswith('export PATH="$PATH:/b/tools/bin"; mkdir -p ' + TMUX_TMPDIR)
    assert env["TMUX_TMPDIR"] == TMUX_TMPDIR
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["SLR_OPENHANDS_API_KEY"] == "k"
    assert env["LD_LIBRARY_PATH"] == "/b/python/lib"
    assert end_tmux("/b") == (
        f'PATH="$PATH:/b/tools/bin" TMUX_TMPDIR={TMUX_TMPDIR} tmux kill-server'
    )


def test_the_condenser_is_on_as_in_openhands_default_agent_and_configurable():
    endpoint = Endpoint(base_url="http://127.0.0.1:9", api_key="k", model="m")
    assert OpenHands().settings(endpoint)["condenser"] == {"max_size": 80, "keep_first": 4}
    off = OpenHands(OpenHandsConfig(condenser=False)).settings(endpoint)
    assert off["condenser"] is None
    with pytest.raises(ValueError, match="condenser_keep_first = 9 leaves nothing to condense"):
        OpenHandsConfig(condenser_max_events=20, condenser_keep_first=9)


def test_the_import_runs_frozen_by_default_and_python_default_is_a_setting():
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    assert OpenHands().command("/b", endpoint)[1]["SLR_FREEZE_IMPORTS"] == "1"
    off = OpenHands(OpenHandsConfig(freeze_imports=False)).command("/b", endpoint)[1]
    assert "SLR_FREEZE_IMPORTS" not in off
