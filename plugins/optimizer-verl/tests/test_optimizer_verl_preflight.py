"""The verl optimizer's preflight: each refusal is one fatal line, before anything starts
(no verl, no torch, no model loaded): routing replay, which verl's FSDP engine does not do;
options it runs at world size 1 only; a cuda device or ranks with nowhere to run (an
nvidia-smi STAND-IN plays the GPUs this machine lacks); and a model other than the engine's."""

from __future__ import annotations

import pytest

from slr.config import load_config
from slr.errors import ConfigError
from slr.plugins import get_plugin_manager
from slr.preflight import Context, gpus, run_checks

DOC = "docs/troubleshooting/training.md#a-setting-is-refused-before-the-run-starts"


def lines(name: str, *sets: str, engine: str = "hf") -> list[str]:
    plugins = get_plugin_manager()
    cfg = load_config(
        plugins=plugins,
        choose={"agent": "nop", "backend": "local", "engine": engine, "optimizer": "verl"},
        sets=list(sets),
    )
    [check] = [c for c in plugins.preflight_checks() if c.name == name]
    report = run_checks([check], Context(config=cfg, plugins=plugins), stages=(check.stage,))
    return [line.text() for line in report.lines]


def test_routing_replay_is_refused_naming_the_torch_optimizer():
    assert lines("verl-routing-replay") == []
    assert lines(
        "verl-routing-replay", "algorithm.routing_replay=true", "engine.return_routed_experts=true"
    ) == [
        "fatal  verl-routing-replay: algorithm.routing_replay = true but the verl optimizer "
        "cannot replay routing: verl replays it only in its megatron and veomni engines, not "
        "the FSDP engine this optimizer runs, so its forward passes would route tokens their "
        'own way. Fix: set [optimizer] name = "torch" (it replays the engine\'s recorded '
        f"routing), or algorithm.routing_replay = false (see {DOC})"
    ]


def test_what_runs_at_world_size_1_only_is_refused_at_2():
    assert lines("verl-world-size") == []
    assert lines("verl-world-size", "optimizer.world_size=2", "algorithm.use_kl_loss=true") == [
        "fatal  verl-world-size: optimizer.world_size = 2 with algorithm.use_kl_loss (the "
        "reference): the verl optimizer spreads only the actor over ranks so far. Fix: set "
        f"world_size = 1 for these, or turn them off (see {DOC})"
    ]
    [fine] = lines("verl-world-size", "optimizer.world_size=2")
    assert fine.startswith("pass ")


def test_a_cuda_device_needs_its_gpus_one_per_rank(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "NVIDIA_SMI", str(tmp_path / "no-nvidia-smi"))
    [none] = lines("verl-device", 'optimizer.device="cuda"')
    assert none.startswith(
        "fatal  verl-device: optimizer.device = 'cuda' with optimizer.world_size = 1 needs 1 "
        "GPU(s), but this machine has none visible"
    )
    assert 'Fix: set optimizer.device = "cpu"' in none
    assert lines("verl-device", 'optimizer.device="auto"') == []  # auto: the cpu here
    stub = tmp_path / "nvidia-smi-stub"  # stands in for a GPU this machine does not have
    stub.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771, 143156'\n")
    stub.chmod(0o755)
    monkeypatch.setattr(gpus, "NVIDIA_SMI", str(stub))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    [one] = lines("verl-device", 'optimizer.device="cuda"')
    assert one.startswith("pass ") and "GPU 0 (NVIDIA H200" in one
    [two] = lines("verl-device", 'optimizer.device="auto"', "optimizer.world_size=2")
    assert two.startswith(
        "fatal  verl-device: optimizer.device = 'auto' with optimizer.world_size = 2 needs 2 "
        "GPU(s), but only 1 are visible"
    )
    assert two.endswith(
        "or lower optimizer.world_size (see docs/troubleshooting/startup.md#no-gpu)"
    )


def test_training_another_model_than_the_engine_samples_warns():
    [same] = lines("verl-model")
    assert same.startswith("pass ")
    [other] = lines("verl-model", 'engine.model="a-model"', 'optimizer.model="b-model"')
    assert other.startswith("warn   verl-model: optimizer.model = 'b-model' but engine.model")
    assert "Fix: leave optimizer.model empty" in other


def test_a_misspelt_estimator_is_refused_at_load():
    with pytest.raises(
        ConfigError,
        match=r"^algorithm.adv_estimator = 'grpoo' is not one the "
        r"'verl' optimizer runs. Did you mean 'grpo'\? Accepted: gae, ",
    ):
        lines("verl-model", "algorithm.adv_estimator=grpoo")


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_ranks_no_node_of_the_cluster_holds_are_refused(ray_cluster):
    [line] = lines(
        "verl-ranks",
        f'run.ray_address="{ray_cluster.address}"',
        "optimizer.world_size=16",
        'optimizer.device="cpu"',
    )
    assert line.startswith(
        "fatal  verl-ranks: optimizer.world_size = 16 puts its ranks on one Ray node asking "
        "CPU = 16, but the nodes have: CPU "
    )
    assert line.endswith(
        f"Fix: lower optimizer.world_size or add a node with room for every rank (see {DOC})"
    )
