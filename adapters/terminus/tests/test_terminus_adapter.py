"""Terminus-2 (harbor), the real package, through the adapter conformance suite."""

from __future__ import annotations

import json

import pytest
from slr_adapter_terminus.adapter import Terminus, TerminusConfig

from slr.contracts import Endpoint
from slr_testkit import PrestartingAdapterTests, ScaffoldAdapterTests
from slr_testkit.scripted_policy import Reply


def terminus_json(commands, complete):
    return json.dumps({
        "analysis": "The directory is empty.", "plan": "Write hello.txt.",
        "commands": [{"keystrokes": k, "duration": 0.5} for k in commands],
        "task_complete": complete,
    })  # fmt: skip


class TestTerminus(ScaffoldAdapterTests, PrestartingAdapterTests):
    @pytest.fixture(scope="class")
    @classmethod
    def adapter(cls):
        return Terminus()

    @pytest.fixture(scope="class")
    @classmethod
    def hello_script(cls):
        # Terminus-2 asks for a confirmation after the first task_complete.
        return [
            Reply(text=terminus_json(["printf 'hello\\n' > hello.txt\n"], True)),
            Reply(text=terminus_json([], True)),
        ]


def test_settings_point_litellm_at_the_endpoint():
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    settings = Terminus().settings(endpoint)
    assert settings["model_name"] == "openai/m"
    assert settings["api_base"] == "http://127.0.0.1:9/v1"
    assert settings["model_info"]["max_input_tokens"] == 8192


def test_command_brings_its_own_tmux_and_litellm_offline_and_ends_tmux_after():
    from slr.agents.tmux import TMUX_TMPDIR, end_tmux

    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    command, env = Terminus().command("/b", endpoint)
    # the bundle's tmux after the image's own, a socket folder of its own
    assert command.startswith('export PATH="$PATH:/b/tools/bin"; mkdir -p ' + TMUX_TMPDIR)
    assert env["TMUX_TMPDIR"] == TMUX_TMPDIR
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["OPENAI_API_KEY"] == "k"
    assert env["LD_LIBRARY_PATH"] == "/b/python/lib"
    assert end_tmux("/b") == (
        f'PATH="$PATH:/b/tools/bin" TMUX_TMPDIR={TMUX_TMPDIR} tmux kill-server'
    )


def test_summarisation_is_on_as_in_harbor_with_a_threshold_that_fits_the_window():
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    settings = Terminus().settings(endpoint)
    assert settings["enable_summarize"] is True
    assert (
        0
        < settings["proactive_summarization_threshold"]
        < settings["model_info"]["max_input_tokens"]
    )
    off = Terminus(TerminusConfig(enable_summarize=False, summarize_free_tokens=0))
    assert off.settings(endpoint)["enable_summarize"] is False


def test_the_import_runs_frozen_by_default_and_python_default_is_a_setting():
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    assert Terminus().command("/b", endpoint)[1]["SLR_FREEZE_IMPORTS"] == "1"
    off = Terminus(TerminusConfig(freeze_imports=False)).command("/b", endpoint)[1]
    assert "SLR_FREEZE_IMPORTS" not in off
