"""The SGLang engine's preflight, tripped and passed, against an SGLang STAND-IN (SGLang
needs a GPU): attached servers answer, a launch needs a Python with SGLang, one GPU set per
replica, and weights_dir for servers elsewhere."""

from __future__ import annotations

import pytest

from slr.config import load_config
from slr.plugins import get_plugin_manager
from slr.preflight import Context, run_checks

pytestmark = pytest.mark.timeout(60)


def results(name: str, *sets: str, purpose="run"):
    plugins = get_plugin_manager()
    cfg = load_config(
        plugins=plugins,
        choose={"agent": "nop", "backend": "local", "engine": "sglang"},
        sets=['engine.model="m"', *sets],
    )
    [check] = [c for c in plugins.preflight_checks() if c.name == name]
    report = run_checks([check], Context(config=cfg, plugins=plugins, purpose=purpose))
    return [line.result for line in report.lines]


def test_an_attached_server_passes_and_a_dead_one_is_fatal(standin):
    [result] = results("sglang-servers", f'engine.urls=["{standin.url}"]')
    assert result.status == "pass" and standin.url in result.message
    [dead] = results("sglang-servers", 'engine.urls=["http://127.0.0.1:9"]')
    assert dead.status == "fatal" and "does not answer /v1/models" in dead.message


def test_a_launch_without_sglang_is_fatal(tmp_path):
    found = results("sglang-servers", f'engine.python="{tmp_path}/no-python"')
    assert found[0].status == "fatal" and "is not on PATH" in found[0].message


def test_gpu_sets_must_match_replicas_and_remote_servers_need_weights_dir():
    [bad] = results("sglang-config", "engine.replicas=2", 'engine.gpus_per_replica=["0"]')
    assert bad.status == "fatal" and "gpus_per_replica" in bad.message
    [remote] = results("sglang-config", 'engine.urls=["http://gpu-a:30000"]')
    assert remote.status == "warn" and "weights_dir" in remote.message
    [fine] = results(
        "sglang-config", 'engine.urls=["http://gpu-a:30000"]', 'engine.weights_dir="/shared/w"'
    )
    assert fine.status == "pass"


def test_tensor_updates_need_servers_on_this_machine():
    [remote] = results(
        "sglang-config", 'engine.urls=["http://gpu-a:30000"]', 'engine.weight_update="tensor"'
    )
    assert remote.status == "fatal" and "shared memory" in remote.message
    [local] = results(
        "sglang-config", 'engine.urls=["http://127.0.0.1:30000"]', 'engine.weight_update="tensor"'
    )
    assert local.status == "pass"
    [group] = results(
        "sglang-config", 'engine.urls=["http://gpu-a:30000"]', 'engine.weight_update="distributed"'
    )
    assert group.status == "warn" and "trainer_address" in group.message


def test_a_lora_run_needs_max_lora_rank_at_least_the_trained_rank():
    [short] = results("sglang-config", "optimizer.lora_rank=16", "engine.max_lora_rank=8")
    assert short.status == "fatal" and "max_lora_rank to at least 16" in short.fix
    [enough] = results("sglang-config", "optimizer.lora_rank=16", "engine.max_lora_rank=16")
    assert enough.status == "pass"
