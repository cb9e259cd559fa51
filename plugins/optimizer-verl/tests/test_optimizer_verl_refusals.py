"""The verl optimizer is found by name through the plugin manager with its own options, and
what it cannot build is refused by name at construction, in one line that says what to do,
before any of verl's workers start."""

from __future__ import annotations

import attrs
import pytest
from slr_optimizer_verl.config import VerlOptimizerConfig

from slr.config import AlgorithmSection, RolloutCorrectionSection, load_config
from slr.errors import ConfigError
from slr.plugins import PluginManager


def test_optimizer_name_verl_takes_its_own_options():
    config = load_config(
        data={"optimizer": {"name": "verl", "lr": 2e-5, "strategy": "fsdp"}},
        plugins=PluginManager(),
    )
    assert isinstance(config.optimizer.options, VerlOptimizerConfig)
    assert (config.optimizer.options.lr, config.optimizer.options.strategy) == (2e-5, "fsdp")
    with pytest.raises(ConfigError, match="strategy"):
        load_config(
            data={"optimizer": {"name": "verl", "strategy": "megatron"}}, plugins=PluginManager()
        )


@pytest.mark.parametrize(
    ("options", "algorithm", "names"),
    [
        ({"model": "/nonexistent/model"}, {}, "cannot load model"),
        ({"model": ""}, {}, "no model to train"),
        ({}, {"policy_loss": "no-such-loss"}, "not a verl policy loss"),
        (
            {},
            {"routing_replay": True},
            r"routing_replay = true but the verl optimizer cannot replay routing: .*; set "
            r'\[optimizer\] name = "torch"',
        ),
        (
            {},
            {"rollout_correction": RolloutCorrectionSection(preset="no-such-preset")},
            "not a verl RolloutCorrectionConfig preset",
        ),
        (
            {"old_logprobs": "rollout"},
            {"rollout_correction": RolloutCorrectionSection(preset="decoupled_token_is")},
            "old_logprobs = 'rollout'",
        ),
        (
            {},
            {
                "policy_loss": "gspo",
                "rollout_correction": RolloutCorrectionSection(preset="bypass_ppo_clip"),
            },
            "bypass_mode = true",
        ),
        ({"world_size": 2}, {"adv_estimator": "gae"}, r"world_size = 2 with .*critic"),
        ({"world_size": 2}, {"use_kl_loss": True}, r"world_size = 2 with .*reference"),
        ({"world_size": 2, "lora_rank": 8}, {}, r"world_size = 2 with optimizer.lora_rank"),
        ({"world_size": 2, "use_fused_kernels": True}, {}, r"world_size = 2 with .*fused"),
        (
            {"world_size": 2},
            {"rollout_correction": RolloutCorrectionSection(preset="decoupled_token_is")},
            r"world_size = 2 with \[algorithm.rollout_correction\]",
        ),
    ],
)
def test_what_is_not_built_is_refused_by_name(options, algorithm, names):
    from slr_optimizer_verl.optimizer import VerlOptimizer

    opts = attrs.evolve(VerlOptimizerConfig(model="a-model-folder", device="cpu"), **options)
    with pytest.raises(ConfigError, match=names) as caught:
        VerlOptimizer(opts, algorithm=AlgorithmSection(**algorithm), temperature=1.0)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_process_where_verl_already_chose_its_platform_is_told_so():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    code = (
        "from verl.utils.device import get_device_name\n"
        "get_device_name()\n"  # verl decides its platform here, once per process
        "from slr_optimizer_verl.cpu_platform import select_cpu\n"
        "select_cpu()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=280
    )
    assert done.returncode != 0
    assert "verl already chose the" in done.stderr
    assert "VERL_PLATFORM=cpu" in done.stderr


def test_a_critic_model_verl_cannot_load_is_named(tiny_model_dir):
    from slr_optimizer_verl.optimizer import VerlOptimizer

    opts = VerlOptimizerConfig(
        model=str(tiny_model_dir), device="cpu", critic_model="/nonexistent/critic"
    )
    with pytest.raises(ConfigError, match="critic_model") as caught:
        VerlOptimizer(opts, algorithm=AlgorithmSection(adv_estimator="gae"), temperature=1.0)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lora_target_modules_that_match_nothing_are_named(tiny_model_dir):
    import torch.distributed as dist
    from slr_optimizer_verl.optimizer import VerlOptimizer

    opts = VerlOptimizerConfig(
        model=str(tiny_model_dir), device="cpu", lora_rank=4, target_modules=["no_such_proj"]
    )
    with pytest.raises(ConfigError, match="target_modules") as caught:
        VerlOptimizer(opts, algorithm=AlgorithmSection(), temperature=1.0)
    assert "\n" not in str(caught.value)
    assert not dist.is_initialized(), "a failed start leaves no process group behind"
