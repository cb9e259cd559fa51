"""The [algorithm] names the torch and verl trainers run are checked when the config is
loaded (``slr config show`` and every command), with the closest name, not when the
optimizer is built after the preflight; the lists are what the installed verl registers
and these trainers can feed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from slr_optimizer_torch.algorithm_names import ADV_ESTIMATORS, KL_LOSS_TYPES, POLICY_LOSSES

from slr.config import load_config
from slr.errors import ConfigError
from slr.plugins import get_plugin_manager


def load(optimizer: str, *sets: str):
    return load_config(
        plugins=get_plugin_manager(), choose={"optimizer": optimizer}, sets=list(sets)
    )


def test_a_misspelt_estimator_or_loss_is_refused_at_load_with_the_closest_name():
    optimizer = "torch"  # slr-optimizer-verl's options inherit the same ACCEPTS
    with pytest.raises(ConfigError) as caught:
        load(optimizer, "algorithm.adv_estimator=grpoo", "algorithm.policy_loss=vanila")
    assert str(caught.value) == (
        f"algorithm.adv_estimator = 'grpoo' is not one the {optimizer!r} optimizer runs. "
        f"Did you mean 'grpo'? Accepted: {', '.join(ADV_ESTIMATORS)}"
    )
    with pytest.raises(ConfigError) as caught:
        load(optimizer, "algorithm.policy_loss=vanila")
    assert str(caught.value) == (
        f"algorithm.policy_loss = 'vanila' is not one the {optimizer!r} optimizer runs. "
        f"Did you mean 'vanilla'? Accepted: {', '.join(POLICY_LOSSES)}"
    )
    with pytest.raises(ConfigError, match=r"algorithm.kl_loss_type = 'full' is not one"):
        load(optimizer, "algorithm.kl_loss_type=full")
    # an estimator verl registers but these trainers cannot feed is refused at load too
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator = 'remax' is not one"):
        load(optimizer, "algorithm.adv_estimator=remax")
    assert load(optimizer, "algorithm.adv_estimator=rloo", "algorithm.policy_loss=gspo")


def test_config_show_refuses_a_misspelt_estimator():
    slr = str(Path(sys.executable).with_name("slr"))
    done = subprocess.run(
        [slr, "config", "show", "--set", "algorithm.adv_estimator=grpoo"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert done.returncode == 2, done.stdout
    assert "algorithm.adv_estimator = 'grpoo' is not one the 'torch' optimizer runs. " in (
        done.stderr
    )
    assert "Did you mean 'grpo'?" in done.stderr


def test_the_lists_are_what_verl_registers_and_these_trainers_feed():
    from slr_optimizer_torch.batch import check_estimator
    from verl.trainer.ppo import core_algos

    fed = []
    for name in sorted(core_algos.ADV_ESTIMATOR_REGISTRY):
        try:
            check_estimator(name)
        except ConfigError:
            continue
        fed.append(name)
    assert list(ADV_ESTIMATORS) == fed
    assert list(POLICY_LOSSES) == sorted(core_algos.POLICY_LOSS_REGISTRY)


def test_every_accepted_kl_loss_type_computes_and_others_do_not():
    import torch
    from verl.trainer.ppo.core_algos import kl_penalty

    logprob, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    for name in KL_LOSS_TYPES:
        assert torch.isfinite(kl_penalty(logprob, ref, name)).all(), name
    for name in ("full", "k4", "low-var-kl"):
        with pytest.raises(NotImplementedError):
            kl_penalty(logprob, ref, name)
