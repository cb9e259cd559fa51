"""OpenCode, the real binary, through the adapter conformance suite."""

from __future__ import annotations

import json

import pytest
from slr_adapter_opencode.adapter import OpenCode, OpenCodeConfig

from slr.contracts import Endpoint
from slr_testkit import ScaffoldAdapterTests
from slr_testkit.scripted_policy import Reply, ToolCall


class TestOpenCode(ScaffoldAdapterTests):
    @pytest.fixture(scope="class")
    @classmethod
    def adapter(cls):
        return OpenCode()

    @pytest.fixture(scope="class")
    @classmethod
    def hello_script(cls):
        return [
            Reply(tool_calls=[ToolCall(name="bash", arguments={
                "command": "printf 'hello\\n' > hello.txt", "description": "write hello.txt"})]),
            Reply(text="Created hello.txt."),
        ]  # fmt: skip


def test_config_makes_the_session_the_only_provider():
    adapter = OpenCode()
    endpoint = Endpoint(base_url="http://127.0.0.1:9", api_key="k", model="m")
    command, env = adapter.command("/b", endpoint)
    assert command.startswith("/b/node_modules/.bin/opencode run --format json --title slr")
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["slr"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://127.0.0.1:9/v1", "apiKey": "k"}
    assert provider["models"]["m"]["tool_call"] is True
    assert config["model"] == "slr/m" and config["enabled_providers"] == ["slr"]
    assert env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"


def test_compaction_is_on_as_in_opencode_and_configurable():
    endpoint = Endpoint(base_url="http://127.0.0.1:9", api_key="k", model="m")
    assert OpenCode().opencode_config(endpoint)["compaction"] == {"auto": True, "prune": False}
    off = OpenCode(OpenCodeConfig(auto_compact=False, prune=True)).opencode_config(endpoint)
    assert off["compaction"] == {"auto": False, "prune": True}
