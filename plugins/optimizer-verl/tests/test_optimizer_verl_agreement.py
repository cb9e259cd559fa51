"""One GRPO step of verl's own FSDP engine (gloo, fp32, world size 1) through this optimizer
agrees with slr-optimizer-torch on the same batch: loss, gradient norm and the log-probs
after the update, within 1e-4 relative. On a tiny random Llama with SmolLM2's vocabulary, so
the suite pays for verl's start, not for two trainers loading a 135M model;
bench/verl_vs_torch.py runs the same comparison on SmolLM2-135M itself."""

from __future__ import annotations

import pytest

from slr.config import AlgorithmSection

TOLERANCE = 1e-4


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_grpo_step_agrees_with_the_torch_optimizer(tiny_model_dir):
    from slr_optimizer_verl.testing import agreement_trials, compare

    model = str(tiny_model_dir)
    out = compare(
        model,
        agreement_trials(49152),
        algorithm=AlgorithmSection(adv_estimator="grpo", policy_loss="vanilla"),
        temperature=0.8,
    )
    assert abs(out["torch_loss"]) > 1e-3, "a batch whose loss is ~0 compares nothing"
    assert out["loss_rel"] <= TOLERANCE, out
    assert out["grad_norm_rel"] <= TOLERANCE, out
    assert out["logprobs_rel_max"] <= TOLERANCE, out
