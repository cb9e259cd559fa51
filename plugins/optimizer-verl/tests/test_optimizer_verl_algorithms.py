"""verl's other roles and options through this optimizer agree with slr-optimizer-torch on the
same batch, from the same tiny random Llama: the reference worker's KL loss, rollout
correction (decoupled and bypass), the critic (gae) and verl's fused log-prob path. Each
runs both trainers (``slr_optimizer_verl.testing.compare``) and compares what the option
changes, within 1e-4 relative."""

from __future__ import annotations

import pytest

from slr.config import AlgorithmSection, RolloutCorrectionSection

TOLERANCE = 1e-4
VOCAB = 49152


def _rel(a: float, b: float) -> float:
    from slr_optimizer_verl.testing import rel

    return rel(a, b)


def _agree(out: dict, *keys: str, atol: float = 1e-6) -> None:
    for key in keys:
        a, b = out["torch"][key], out["verl"][key]
        assert abs(a - b) <= atol or _rel(a, b) <= TOLERANCE, (key, a, b)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kl_loss_from_verls_reference_worker_agrees_with_the_torch_optimizer(tiny_model_dir):
    from slr_optimizer_verl.testing import agreement_trials, compare

    # the second step: the policy has moved from the frozen reference, so the KL is not 0
    out = compare(
        str(tiny_model_dir),
        agreement_trials(VOCAB),
        algorithm=AlgorithmSection(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="low_var_kl"),
        temperature=0.8,
        lr=1e-3,
        steps=2,
    )
    assert out["verl"]["actor/kl_loss"] > 1e-3, "a KL of ~0 compares nothing"
    _agree(out, "actor/kl_loss", "actor/pg_loss", "actor/grad_norm")
    assert out["logprobs_rel_max"] <= TOLERANCE, out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_decoupled_rollout_correction_agrees_with_the_torch_optimizer(tiny_model_dir):
    from slr_optimizer_verl.testing import agreement_trials, compare, near_policy

    model = str(tiny_model_dir)
    trials = near_policy(model, agreement_trials(VOCAB), temperature=0.8, noise=0.5)
    section = RolloutCorrectionSection(
        preset="decoupled_token_is", rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6"
    )
    out = compare(
        model, trials, algorithm=AlgorithmSection(rollout_correction=section), temperature=0.8
    )
    verl = out["verl"]
    # some tokens weighed down, some truncated, some rejected: not a trivial correction
    assert 0 < verl["rollout_corr/rollout_rs_masked_fraction"] < 1
    assert verl["rollout_corr/rollout_is_min"] < 0.9 and verl["rollout_corr/rollout_is_max"] == 2
    corr = sorted(k for k in out["torch"] if k.startswith("rollout_corr/"))
    assert corr and set(corr) <= set(verl)
    _agree(out, *corr, "actor/pg_loss", "actor/grad_norm")
    assert out["logprobs_rel_max"] <= TOLERANCE, out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bypass_mode_agrees_with_the_torch_optimizer(tiny_model_dir):
    from slr_optimizer_verl.testing import agreement_trials, compare, near_policy

    model = str(tiny_model_dir)
    trials = near_policy(model, agreement_trials(VOCAB), temperature=0.8, noise=0.5)
    section = RolloutCorrectionSection(preset="bypass_ppo_clip")
    out = compare(
        model, trials, algorithm=AlgorithmSection(rollout_correction=section), temperature=0.8
    )
    assert abs(out["torch_loss"]) > 1e-3 and out["torch_grad_norm"] > 0
    _agree(out, "actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac")
    assert out["logprobs_rel_max"] <= TOLERANCE, out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gae_with_verls_critic_worker_agrees_with_the_torch_value_head(tiny_model_dir, tmp_path):
    """verl's critic is a value model of its own (the policy's trunk, a one-label head) with
    its own AdamW; the torch optimizer's value head shares the policy's trunk and its update.
    From the same trunk and head, the values, so gae's advantages and returns, and the first
    update's value loss are the same. With the torch optimizer's value_coef = 0 its policy
    update is the policy loss alone, as verl's actor's is, so the policy agrees too; the two
    critics' updates differ by design (a separate model and learning rate vs a head trained
    through the shared trunk) and are not compared."""
    from slr_optimizer_verl.testing import agreement_trials, compare, critic_folder

    model = str(tiny_model_dir)
    head = critic_folder(model, tmp_path / "critic")
    out = compare(
        model,
        agreement_trials(VOCAB),
        algorithm=AlgorithmSection(adv_estimator="gae"),
        temperature=0.8,
        torch_options={"value_coef": 0.0},
        verl_options={"critic_model": str(tmp_path / "critic")},
        value_head=head,
    )
    assert out["verl"]["critic/vf_loss"] > 1e-3 and out["verl"]["critic/grad_norm"] > 0
    _agree(out, "advantages/mean", "advantages/max", "advantages/min", "critic/vf_loss")
    _agree(out, "actor/grad_norm")
    assert out["logprobs_rel_max"] <= TOLERANCE, out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fused_kernels_run_verls_fused_path_and_agree_with_the_torch_optimizer(tiny_model_dir):
    from slr_optimizer_verl.testing import agreement_trials, compare
    from transformers import LlamaForCausalLM

    own_forward = LlamaForCausalLM.forward
    fused = {"use_fused_kernels": True}
    out = compare(
        str(tiny_model_dir),
        agreement_trials(VOCAB),
        algorithm=AlgorithmSection(),
        temperature=0.8,
        torch_options=fused,
        verl_options=fused,
    )
    assert abs(out["torch_loss"]) > 1e-3
    assert out["loss_rel"] <= TOLERANCE, out
    assert out["grad_norm_rel"] <= TOLERANCE, out
    assert out["logprobs_rel_max"] <= TOLERANCE, out
    # verl replaced the class's forward for its engine; the closed optimizer put it back
    assert LlamaForCausalLM.forward is own_forward
