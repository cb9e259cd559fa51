"""mini-swe-agent, the real package, through the adapter conformance suite."""

from __future__ import annotations

import pytest
from slr_adapter_mini_swe_agent.adapter import MiniSweAgent, MiniSweAgentConfig

from slr.contracts import Endpoint
from slr.testing import ScaffoldAdapterTests
from slr.testing.scripted_policy import Reply

HELLO = "THOUGHT: write the file.\n\n```mswea_bash_command\nprintf 'hello\\n' > hello.txt\n```"
SUBMIT = "THOUGHT: done.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


class TestMiniSweAgent(ScaffoldAdapterTests):
    @pytest.fixture(scope="class")
    @classmethod
    def adapter(cls):
        return MiniSweAgent()

    @pytest.fixture(scope="class")
    @classmethod
    def hello_script(cls):
        return [Reply(text=HELLO), Reply(text=SUBMIT)]


def test_command_points_litellm_at_the_endpoint():
    adapter = MiniSweAgent(MiniSweAgentConfig(step_limit=7))
    endpoint = Endpoint(base_url="http://127.0.0.1:9", api_key="k", model="m")
    command, env = adapter.command("/b", endpoint)
    assert command.startswith(
        "/b/python/bin/python3.12 -m minisweagent.run.mini -c mini_textbased.yaml"
    )
    for part in ("model.model_kwargs.api_base=http://127.0.0.1:9/v1", "model.model_kwargs.api_key=k",
                 "agent.step_limit=7", "--model openai/m", "--yolo", "--exit-immediately"):  # fmt: skip
        assert part in command
    assert env["LD_LIBRARY_PATH"] == "/b/python/lib"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["MSWEA_CONFIGURED"] == "true"
