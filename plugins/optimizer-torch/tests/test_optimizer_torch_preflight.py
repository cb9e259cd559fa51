"""The torch optimizer's preflight: it trains the engine's model (a different one warns),
and a CUDA device must be here (fatal on this CPU-only machine; an nvidia-smi STAND-IN
shows the pass)."""

from __future__ import annotations

from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.preflight import Context, gpus, run_checks


def results(name: str, *sets: str):
    plugins = get_plugin_manager()
    cfg = load_config(
        plugins=plugins,
        choose={"agent": "nop", "backend": "local", "engine": "hf", "optimizer": "torch"},
        sets=list(sets),
    )
    [check] = [c for c in plugins.preflight_checks() if c.name == name]
    report = run_checks([check], Context(config=cfg, plugins=plugins), stages=(check.stage,))
    return [line.result for line in report.lines]


def test_training_another_model_than_the_engine_samples_warns():
    [same] = results("torch-model")
    assert same.status == "pass"
    [other] = results("torch-model", 'engine.model="a-model"', 'optimizer.model="b-model"')
    assert other.status == "warn" and "optimizer.model = 'b-model'" in other.message
    assert "leave optimizer.model empty" in other.fix


def test_a_cuda_device_needs_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "NVIDIA_SMI", str(tmp_path / "no-nvidia-smi"))
    [none] = results("torch-device", 'optimizer.device="cuda"')
    assert none.status == "fatal" and "needs 1 GPU(s), but this machine has none" in none.message
    assert results("torch-device", 'optimizer.device="auto"') == []
    stub = tmp_path / "nvidia-smi-stub"  # stands in for a GPU this machine does not have
    stub.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771, 143156'\n")
    stub.chmod(0o755)
    monkeypatch.setattr(gpus, "NVIDIA_SMI", str(stub))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    [found] = results("torch-device", 'optimizer.device="cuda"')
    assert found.status == "pass" and "GPU 0 (NVIDIA H200" in found.message


def test_routing_replay_needs_the_engine_to_record_routing():
    assert results("torch-routing-replay") == []  # replay off: nothing to check
    [off] = results("torch-routing-replay", "algorithm.routing_replay=true")
    assert off.status == "fatal" and "engine.return_routed_experts = false" in off.message
    assert "return_routed_experts = true" in off.fix
    [on] = results(
        "torch-routing-replay", "algorithm.routing_replay=true", "engine.return_routed_experts=true"
    )
    assert on.status == "pass"
