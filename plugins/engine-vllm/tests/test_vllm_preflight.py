"""The vLLM engine's preflight, tripped and passed: attached servers answer and serve the
model (a vLLM STAND-IN server, since vLLM needs a GPU), a launch finds its command and its
GPUs, one GPU set per replica, and the truncated-log-prob pitfall."""

from __future__ import annotations

import socket

import pytest
import vllm_standin

from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.preflight import Context, gpus, run_checks


def results(name: str, *sets: str, purpose="run"):
    plugins = get_plugin_manager()
    cfg = load_config(
        plugins=plugins,
        choose={"agent": "nop", "backend": "local", "engine": "vllm"},
        sets=['engine.model="m"', *sets],
    )
    [check] = [c for c in plugins.preflight_checks() if c.name == name]
    report = run_checks([check], Context(config=cfg, plugins=plugins, purpose=purpose))
    return [line.result for line in report.lines]


@pytest.fixture
def standin():
    server, url = vllm_standin.start(vllm_standin.StandInState(served_model_name="slr-policy"))
    yield url
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(60)
def test_an_attached_server_that_serves_the_model_passes(standin):
    [result] = results("vllm-servers", f'engine.urls=["{standin}"]')
    assert result.status == "pass" and "serves 'slr-policy'" in result.message
    [other] = results("vllm-servers", f'engine.urls=["{standin}"]', 'engine.served_model_name="x"')
    assert other.status == "fatal" and "not engine.served_model_name = 'x'" in other.message


@pytest.mark.timeout(60)
def test_a_server_that_does_not_answer_is_fatal():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again at once: nobody listens there
    [result] = results("vllm-servers", f'engine.urls=["http://127.0.0.1:{port}"]')
    assert result.status == "fatal" and "does not answer /v1/models" in result.message
    assert result.doc == "docs/troubleshooting/startup.md#engine-unreachable"


def test_a_launch_without_vllm_or_a_gpu_is_fatal(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "NVIDIA_SMI", str(tmp_path / "no-nvidia-smi"))
    exe, gpu = results("vllm-servers", f'engine.executable="{tmp_path / "no-vllm"}"')
    assert exe.status == "fatal" and "is not on PATH" in exe.message
    assert gpu.status == "fatal" and "1 vLLM server(s) to launch needs 1 GPU(s)" in gpu.message


def test_replicas_need_one_gpu_set_each_and_truncated_logprobs_warn():
    [bad] = results("vllm-config", "engine.replicas=2", 'engine.gpus_per_replica=["0"]')
    assert bad.status == "fatal" and "lists 1 GPU set(s)" in bad.message
    [trunc] = results("vllm-config", "engine.allow_truncated_logprobs=true", "rollout.top_p=0.9")
    assert trunc.status == "warn" and "renormalized" in trunc.message
    [fine] = results("vllm-config", "engine.replicas=2", 'engine.gpus_per_replica=["0", "1"]')
    assert fine.status == "pass"


def test_routed_experts_in_async_training_are_refused_before_the_rollout():
    plugins = get_plugin_manager()
    cfg = load_config(
        plugins=plugins,
        choose={"agent": "nop", "backend": "local", "engine": "vllm"},
        sets=['engine.model="m"', "engine.return_routed_experts=true", 'run.mode="async"'],
    )
    [check] = [c for c in plugins.preflight_checks() if c.name == "vllm-config"]
    report = run_checks([check], Context(config=cfg, plugins=plugins), stages=("config",))
    assert [line.text() for line in report.fatal] == [
        "fatal  vllm-config: engine.return_routed_experts = true with run.mode = 'async': "
        "async training pushes weights mid-generation (a partial update), and vLLM returns "
        "routed experts only with the whole completion, so a generation has no token boundary "
        "to pause at and the first training step would fail after a whole rollout. Fix: set "
        "run.mode = 'sync', or engine.return_routed_experts = false (and "
        "algorithm.routing_replay = false) (see "
        "docs/troubleshooting/training.md#a-setting-is-refused-before-the-run-starts)"
    ]
    [sync] = results("vllm-config", "engine.return_routed_experts=true")
    assert sync.status == "pass"
