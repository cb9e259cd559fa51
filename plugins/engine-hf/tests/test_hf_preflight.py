"""The hf engine's preflight (`hf-model`) and the core's model checks it runs, on the real
SmolLM2 tokenizer: each tripped by a config or a chat template, and passed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from slr_engine_hf.config import DEFAULT_MODEL
from slr_engine_hf.models import ensure_tokenizer
from transformers import AutoTokenizer

from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.preflight import Context, run_checks
from slr.preflight.model import chat_template_round_trip, tool_call_round_trip

ROOT = Path(__file__).resolve().parents[3]

# A template in the Llama 3 manner: native tools, calls written as bare JSON.
JSON_CALLS = (
    "{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}"
    '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}'
    "{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(ensure_tokenizer(DEFAULT_MODEL)))


def hf_model(*sets: str):
    plugins = get_plugin_manager()
    cfg = load_config(
        plugins=plugins,
        choose={"agent": "mini-swe-agent", "backend": "local", "engine": "hf"},
        sets=[f'tasks.path="{ROOT / "examples" / "tasks"}"', *sets],
    )
    checks = [c for c in plugins.preflight_checks() if c.name == "hf-model"]
    report = run_checks(checks, Context(config=cfg, plugins=plugins), stages=("data",))
    return [line.result for line in report.lines]


@pytest.mark.timeout(120)
def test_the_packaged_model_passes_every_model_check():
    results = hf_model()
    assert [r.status for r in results] == ["pass"] * 4, results
    assert "parses back" in results[2].message
    assert "context 8192" in results[3].message


@pytest.mark.timeout(120)
def test_max_tokens_beyond_the_context_is_fatal():
    results = hf_model("rollout.max_tokens=9000")
    assert results[-1].status == "fatal"
    assert "8192" in results[-1].message and "rollout.max_tokens" in results[-1].fix


@pytest.mark.timeout(120)
def test_a_model_that_is_not_here_is_fatal(tmp_path):
    [result] = hf_model(f'engine.model="{tmp_path / "no-model"}"')
    assert result.status == "fatal" and "no-model" in result.message


def test_a_template_whose_tool_calls_the_parser_cannot_read_is_fatal(tokenizer):
    assert tool_call_round_trip(tokenizer, "hermes", "openai").status == "pass"
    json_calls = copy.deepcopy(tokenizer)
    json_calls.chat_template = JSON_CALLS
    result = tool_call_round_trip(json_calls, "hermes", "anthropic")
    assert result.status == "fatal"
    assert '"parameters"' in result.message and "proxy.tool_parser" in result.fix
    assert "scaffold protocol anthropic" in result.message


def test_a_tokenizer_without_a_chat_template_is_fatal(tokenizer):
    assert chat_template_round_trip(tokenizer).status == "pass"
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    result = chat_template_round_trip(bare)
    assert result.status == "fatal" and "no chat template" in result.message


def test_a_cuda_device_on_a_machine_without_gpu_is_fatal(tmp_path, monkeypatch):
    from slr.preflight import gpus

    monkeypatch.setattr(gpus, "NVIDIA_SMI", str(tmp_path / "no-nvidia-smi"))
    plugins = get_plugin_manager()
    for device, expected in (("cuda", "fatal"), ("cpu", None)):
        cfg = load_config(
            plugins=plugins,
            choose={"agent": "nop", "backend": "local", "engine": "hf"},
            sets=[f'engine.device="{device}"'],
        )
        [check] = [c for c in plugins.preflight_checks() if c.name == "hf-device"]
        lines = run_checks([check], Context(config=cfg, plugins=plugins), stages=("machine",)).lines
        assert [line.result.status for line in lines] == ([expected] if expected else [])
        if expected:
            assert 'engine.device = "cpu"' in lines[0].result.fix
