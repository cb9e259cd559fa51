"""Off-policy correction: [algorithm.rollout_correction] -> verl's rollout correction, in the loss.

The crafted batch: one group of two trials (rewards 1 and 0, so GRPO gives every token of
the first advantage +1/sqrt(2) and of the second -1/sqrt(2)), sampled from the tiny model
itself so the trainer's log-probs equal the behaviour ones; then the behaviour log-probs of
chosen tokens are lowered by log(k), which makes their IS ratio pi_trainer / pi_rollout
exactly k. With one update, PPO's ratio to pi_old is 1, so the vanilla loss is
-sum(A * w) / tokens, and each mode's weights w are known by hand.
"""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.correction import presets, resolve
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.testing import sample, tiny_causal_lm, trial

from slr.config import AlgorithmSection, RolloutCorrectionSection, load_config
from slr.errors import ConfigError
from slr.plugins import PluginManager

PROMPT = [1, 2, 3]
N = 5  # completion tokens per trial
A = 1 / math.sqrt(2)  # GRPO advantage of each trial (rewards 1 and 0)


def _algorithm(**correction) -> AlgorithmSection:
    return AlgorithmSection(rollout_correction=RolloutCorrectionSection(**correction))


def _optimizer(algorithm: AlgorithmSection, **options) -> TorchOptimizer:
    return TorchOptimizer(
        TorchOptimizerConfig(**{"lr": 1e-3, **options}),
        algorithm=algorithm,
        temperature=1.0,
        model=tiny_causal_lm(seed=3),
    )


def _crafted(ratios: dict[tuple[int, int], float]):
    """The two trials; ``ratios[(trial, token)] = k`` makes that token's IS ratio k."""
    tokens, logprobs = sample(
        tiny_causal_lm(seed=3),
        PROMPT,
        n=2,
        max_new_tokens=N,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    trials = []
    for i, reward in enumerate((1.0, 0.0)):
        lps = logprobs[i].tolist()
        for (t, j), k in ratios.items():
            if t == i:
                lps[j] -= math.log(k)
        seg = (PROMPT + tokens[i].tolist(), [0] * len(PROMPT) + [1] * N, [0.0] * len(PROMPT) + lps)
        trials.append(trial(f"t{i}", "g", [seg], reward))
    return trials


# -- config -----------------------------------------------------------------------------


def test_the_table_maps_to_verls_config_preset_first_then_verls_field_names():
    config = load_config(
        data={
            "algorithm": {
                "rollout_correction": {
                    "preset": "decoupled_seq_is_rs",
                    "rollout_is_threshold": 3.0,
                    "rollout_rs": "none",
                }
            }
        },
        plugins=PluginManager(),
        only_plugins=(),
    )
    correction = resolve(config.algorithm)
    assert correction is not None
    c = correction.config
    assert (c.rollout_is, c.rollout_is_threshold, c.rollout_rs) == ("sequence", 3.0, None)
    assert correction.decoupled and not correction.bypass
    bypass = resolve(_algorithm(preset="bypass_ppo_clip_k3_rs"))
    assert bypass is not None and bypass.bypass
    assert (bypass.config.rollout_rs, bypass.config.rollout_rs_threshold) == ("seq_mean_k3", 0.01)
    # unset: no correction object at all (the trainer runs as it did without the option)
    assert resolve(AlgorithmSection()) is None
    assert "decoupled_token_is" in presets() and "bypass_pg_is" in presets()


@pytest.mark.parametrize(
    ("correction", "options", "message"),
    [
        ({"preset": "tis"}, {}, "Presets: bypass_pg_geo_rs"),
        ({"rollout_is": "tokens"}, {}, "Allowed: token, sequence, none"),
        ({"rollout_rs": "seq_mean_k9", "rollout_rs_threshold": 0.1}, {}, "seq_mean_k9 is not"),
        ({"rollout_rs": "token_k3"}, {}, "needs rollout_rs_threshold"),
        ({"rollout_is": "token", "rollout_is_threshold": "two"}, {}, "rollout_is_threshold"),
        ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.5_2"}, {}, "single upper bound"),
        ({"bypass_mode": True, "loss_type": "ppo"}, {}, "Allowed: ppo_clip, reinforce"),
        ({"rollout_is": "token"}, {"old_logprobs": "rollout"}, "old_logprobs = 'recompute'"),
    ],
)
def test_bad_names_and_thresholds_fail_when_the_optimizer_is_built(correction, options, message):
    with pytest.raises(ConfigError, match=message):
        _optimizer(_algorithm(**correction), **options)


def test_bypass_mode_refuses_a_policy_loss_it_would_replace_and_unknown_keys_are_named():
    algorithm = attrs.evolve(_algorithm(preset="bypass_ppo_clip"), policy_loss="gspo")
    with pytest.raises(ConfigError, match="policy_loss = 'gspo' would be ignored"):
        resolve(algorithm)
    with pytest.raises(ConfigError, match="Did you mean 'rollout_is_threshold'"):
        load_config(
            data={"algorithm": {"rollout_correction": {"rollout_is_threshhold": 2.0}}},
            plugins=PluginManager(),
            only_plugins=(),
        )


# -- the loss, mode by mode --------------------------------------------------------------


@pytest.mark.parametrize(
    ("correction", "ratios", "expected"),
    [
        # token TIS: the first trial's ratio 5 is capped at 2
        ({"preset": "decoupled_token_is"}, {(0, j): 5.0 for j in range(N)}, -(2 * A - A) / 2),
        # token IcePop band [0.5, 2]: ratio 5 is outside, its weight 0
        ({"preset": "decoupled_token_icepop", "rollout_is_threshold": "0.5_2.0"},
         {(0, j): 5.0 for j in range(N)}, -(0 - A) / 2),
        # sequence IS: one token's ratio 1.5 weighs the whole sequence
        ({"preset": "decoupled_seq_is"}, {(0, 2): 1.5}, -(1.5 * A - A) / 2),
        # ... and its product over the sequence is capped: 1.5 * 1.5 -> 2
        ({"preset": "decoupled_seq_is"}, {(0, 1): 1.5, (0, 3): 1.5}, -(2 * A - A) / 2),
        # token-level rejection: tokens whose ratio leaves [0.5, 2] leave the loss
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"},
         {(0, j): 5.0 for j in range(N)}, A),
        # bypass + PPO clip: the ratio to the rollout, 5, is clipped at 1 + 0.2
        ({"preset": "bypass_ppo_clip"}, {(0, j): 5.0 for j in range(N)}, -(1.2 * A - A) / 2),
    ],
)  # fmt: skip
def test_each_mode_weighs_the_loss_as_verls_functions_say(correction, ratios, expected):
    opt = _optimizer(_algorithm(**correction))
    metrics = opt.step(_crafted(ratios))
    assert metrics["actor/pg_loss"] == pytest.approx(expected, abs=1e-4)
    assert metrics["update/count"] == 1


def test_without_correction_the_same_batch_is_unweighted():
    metrics = _optimizer(AlgorithmSection()).step(_crafted({(0, j): 5.0 for j in range(N)}))
    assert metrics["actor/pg_loss"] == pytest.approx(0.0, abs=1e-5)  # -(A - A) / 2


def test_metrics_report_the_gap_the_weights_and_what_was_cut():
    ratios = {(0, j): 5.0 for j in range(N)}
    tis = _optimizer(_algorithm(preset="decoupled_token_is")).step(_crafted(ratios))
    # KL(rollout || trainer) estimated by verl: mean(log pi_rollout - log pi_trainer)
    assert tis["rollout_corr/kl"] == pytest.approx(-math.log(5) / 2, abs=1e-4)
    assert tis["rollout_corr/k3_kl"] > 0
    assert tis["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    # weights 2 and 1 in equal numbers: ESS = mean(w)^2 / mean(w^2) = 2.25 / 2.5
    assert tis["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(0.9, abs=1e-4)
    rs = _optimizer(_algorithm(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")).step(
        _crafted(ratios)
    )
    assert rs["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    assert rs["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    bypass = _optimizer(_algorithm(preset="bypass_ppo_clip")).step(_crafted(ratios))
    assert bypass["actor/pg_clipfrac"] == pytest.approx(0.5)  # the ratio-5 tokens
    assert bypass["rollout_corr/kl"] == pytest.approx(-math.log(5) / 2, abs=1e-4)


def test_all_tokens_rejected_skips_the_update_and_says_so():
    ratios = {(t, j): 5.0 for t in range(2) for j in range(N)}
    opt = _optimizer(_algorithm(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"))
    before = [p.detach().clone() for p in opt.model.parameters()]
    metrics = opt.step(_crafted(ratios))
    assert metrics["update/skipped"] == 1.0
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, opt.model.parameters(), strict=True))


def test_default_off_is_todays_update_exactly_and_still_measures_the_gap():
    trials = _crafted({(0, 1): 3.0, (1, 2): 0.5})
    off = _optimizer(AlgorithmSection())
    # verl's "disabled" config (metrics only) takes the same path: nothing to apply
    metrics_only = _optimizer(_algorithm(preset="disabled"))
    assert off.correction is None and metrics_only.correction is not None
    m_off, m_only = off.step(trials), metrics_only.step(trials)
    assert m_off["actor/pg_loss"] == m_only["actor/pg_loss"]
    for a, b in zip(off.model.parameters(), metrics_only.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert m_off["rollout_corr/kl"] == pytest.approx((-math.log(3) + math.log(2)) / 10, abs=1e-5)
    assert not any(k.startswith("rollout_corr/rollout_is") for k in m_off)


def test_token_versions_give_the_batchs_spread_and_age():
    trials = _crafted({})
    trajectory = trials[0].trajectory
    assert trajectory is not None
    versions = (0,) * len(PROMPT) + (0, 0, 1, 1, 1)
    seg = attrs.evolve(trajectory.segments[0], weights_versions=versions)
    spanning = attrs.evolve(trials[0], trajectory=attrs.evolve(trajectory, segments=[seg]))
    older = attrs.evolve(trials[1], weights_version=0)  # no per-token record: the trial's
    opt = _optimizer(AlgorithmSection())
    opt.steps = 1  # the weights being updated are version 1
    metrics = opt.step([spanning, older])
    assert metrics["rollout/token_version_min"] == 0
    assert metrics["rollout/token_version_max"] == 1
    assert metrics["rollout/token_age_max"] == 1
    assert metrics["rollout/token_age_mean"] == pytest.approx(7 / 10)
    assert metrics["rollout/stale_token_fraction"] == pytest.approx(7 / 10)
    assert metrics["rollout/trials_multi_version"] == 1
    assert metrics["rollout/tokens_unknown_version"] == 0
