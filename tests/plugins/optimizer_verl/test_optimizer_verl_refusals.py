"""The verl optimizer is found by name through the plugin manager with its own options, and
what it does not build yet is refused by name at construction, in one line that says what
to do, before any of verl's workers start."""

from __future__ import annotations

import attrs
import pytest
from slr_optimizer_verl.config import VerlOptimizerConfig

from slr.config import AlgorithmSection, load_config
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
        ({}, {"adv_estimator": "gae"}, "critic"),
        ({}, {"use_kl_loss": True}, "reference worker"),
        ({}, {"policy_loss": "no-such-loss"}, "not a verl policy loss"),
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
