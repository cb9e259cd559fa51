"""One GRPO step of verl's own FSDP engine (gloo, fp32, world size 1) through this optimizer
agrees with slr-optimizer-torch on the same batch from SmolLM2-135M: loss, gradient norm and
the log-probs after the update, within 1e-4 relative."""

from __future__ import annotations

import pytest

from slr.config import AlgorithmSection

TOLERANCE = 1e-4


@pytest.mark.slow
@pytest.mark.timeout(900)  # two trainers load and step a 135M model; minutes on a busy CPU
def test_one_grpo_step_agrees_with_the_torch_optimizer():
    from slr_engine_hf.models import ensure_model
    from slr_optimizer_verl.testing import agreement_trials, compare

    model = str(ensure_model("smollm2-135m-instruct"))
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
