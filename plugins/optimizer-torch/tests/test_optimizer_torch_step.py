"""TorchOptimizer on tiny real models: log-prob agreement, learning, losses by name, resume."""

from __future__ import annotations

import attrs
import pytest
import torch
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.optimizer import TorchOptimizer
from slr_optimizer_torch.testing import sample, sample_trials, tiny_causal_lm, trial

from slr.config import AlgorithmSection
from slr.contracts import Optimizer
from slr.errors import ConfigError, UsageError
from slr.plugins import PluginManager
from slr.run import checkpoints
from slr.run.directory import RunDir

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]


def _optimizer(model=None, *, temperature=1.0, algorithm=None, **options) -> TorchOptimizer:
    return TorchOptimizer(
        TorchOptimizerConfig(**{"lr": 1e-3, **options}),
        algorithm=algorithm or AlgorithmSection(),
        temperature=temperature,
        model=model if model is not None else tiny_causal_lm(),
    )


def _trials(model, *, temperature, seed=0, n=6, prefix="t"):
    return sample_trials(
        model,
        PROMPTS,
        n=n,
        max_new_tokens=5,
        temperature=temperature,
        reward=lambda c: float(c[0] % 2 == 0),
        generator=torch.Generator().manual_seed(seed),
        prefix=prefix,
    )


def test_the_torch_optimizer_is_registered_through_its_entry_point():
    registration = PluginManager().get("optimizer", "torch")
    assert registration.load() is TorchOptimizer
    assert registration.config_cls is TorchOptimizerConfig
    assert registration.plugin.distribution == "slr-optimizer-torch"


def test_logprob_agreement_is_exact_for_matching_weights_and_temperature():
    model = tiny_causal_lm()
    opt = _optimizer(model, temperature=0.7)
    metrics = opt.step(_trials(model, temperature=0.7))
    assert metrics["rollout/logprob_pearson"] > 0.999
    assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4
    assert metrics["batch/policy_tokens"] == 3 * 6 * 5
    assert isinstance(opt, Optimizer)


def test_logprob_agreement_drops_when_the_temperature_or_the_weights_differ():
    # a peaky model (like a trained one): a temperature mismatch is not a near-affine change
    model = tiny_causal_lm(init_std=0.3)
    matched = _optimizer(model, temperature=1.0).step(_trials(model, temperature=1.0))
    hotter = _optimizer(model, temperature=1.0).step(_trials(model, temperature=0.5))
    assert matched["rollout/logprob_abs_diff_mean"] < 1e-4
    # the mean abs diff is the sensitive signal for temperature; Pearson moves less
    assert hotter["rollout/logprob_abs_diff_mean"] > 0.1
    assert hotter["rollout/logprob_pearson"] < 0.999 < matched["rollout/logprob_pearson"]
    # stale or wrong weights (a missed weight sync): the correlation itself collapses
    other = tiny_causal_lm(init_std=0.3, seed=9)
    stale = _optimizer(other, temperature=1.0).step(_trials(model, temperature=1.0))
    assert stale["rollout/logprob_pearson"] < 0.5
    assert stale["rollout/logprob_abs_diff_mean"] > 0.5


def test_agreement_is_measured_before_the_update_with_several_mini_batches():
    model = tiny_causal_lm()
    opt = _optimizer(model, temperature=0.9, ppo_mini_batch_size=1, ppo_epochs=2, lr=1e-2)
    metrics = opt.step(_trials(model, temperature=0.9))
    assert metrics["update/count"] == 6  # 3 groups of one group each, twice
    assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4
    # later updates see moved weights: the ratio departs from 1 and verl's clip engages
    assert metrics["actor/ppo_kl"] != 0


def test_each_segment_of_a_history_rewrite_is_scored_in_its_own_context():
    """Behaviour log-probs come from each segment's own context; the trainer must match them."""
    model = tiny_causal_lm()
    gen = torch.Generator().manual_seed(5)
    first_prompt = [1, 2, 3, 4]
    turn1, lp1 = sample(model, first_prompt, n=1, max_new_tokens=6, temperature=1.0, generator=gen)
    # the agent compacts its history: a new, shorter prompt, then the policy continues
    second_prompt = [1, 9, 9]
    turn2, lp2 = sample(model, second_prompt, n=1, max_new_tokens=6, temperature=1.0, generator=gen)
    seg1 = (first_prompt + turn1[0].tolist(), [0] * 4 + [1] * 6, [0.0] * 4 + lp1[0].tolist())
    seg2 = (second_prompt + turn2[0].tolist(), [0] * 3 + [1] * 6, [0.0] * 3 + lp2[0].tolist())
    trials = [
        trial("split", "g", [seg1, seg2], 1.0),
        trial("other", "g", [seg1], 0.0),
    ]
    metrics = _optimizer(model).step(trials)
    assert metrics["trials/multi_segment"] == 1
    assert metrics["batch/sequences"] == 3
    assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4

    # Scored as one concatenated sequence, the second turn's context would be wrong:
    joined = (seg1[0] + seg2[0], seg1[1] + seg2[1], seg1[2] + seg2[2])
    wrong = _optimizer(model).step(
        [trial("joined", "g", [joined], 1.0), trial("o", "g", [seg1], 0.0)]
    )
    assert wrong["rollout/logprob_abs_diff_mean"] > 10 * metrics["rollout/logprob_abs_diff_mean"]


def _p_even_next(model, prompts) -> float:
    with torch.no_grad():
        probs = []
        for prompt in prompts:
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
            probs.append(float(torch.softmax(logits.float(), dim=-1)[0::2].sum()))
    return sum(probs) / len(probs)


def test_grpo_steps_raise_the_probability_of_rewarded_completions():
    """Reward: the fraction of even tokens in the completion. The policy must learn it."""
    model = tiny_causal_lm(seed=1, vocab_size=32)
    opt = _optimizer(model, lr=1e-2)
    before = _p_even_next(model, PROMPTS)
    rewards = []
    for step in range(8):
        trials = sample_trials(
            model,
            PROMPTS,
            n=8,
            max_new_tokens=4,
            temperature=1.0,
            reward=lambda c: sum(1 for x in c if x % 2 == 0) / len(c),
            generator=torch.Generator().manual_seed(step),
            prefix=f"s{step}-",
        )
        metrics = opt.step(trials)
        rewards.append(metrics["reward/mean"])
        assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4  # on-policy every step
    after = _p_even_next(model, PROMPTS)
    assert after > before + 0.2, (before, after, rewards)
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards


@pytest.mark.parametrize(
    ("policy_loss", "loss_agg_mode"),
    [("vanilla", "seq-mean-token-mean"), ("gspo", "seq-mean-token-mean"), ("cispo", "token-mean")],
)
def test_policy_losses_by_name_and_micro_batching_does_not_change_the_update(
    policy_loss, loss_agg_mode
):
    """verl normalises each micro-batch by the mini-batch, so splits give the same gradient."""
    algorithm = AlgorithmSection(policy_loss=policy_loss, loss_agg_mode=loss_agg_mode)
    trials = _trials(tiny_causal_lm(), temperature=1.0)
    whole = _optimizer(algorithm=algorithm, micro_batch_tokens=10_000)
    split = _optimizer(algorithm=algorithm, micro_batch_tokens=20)
    m_whole, m_split = whole.step(trials), split.step(trials)
    assert m_whole["update/micro_batches"] == 1
    assert m_split["update/micro_batches"] > 4
    assert m_whole["actor/pg_loss"] == pytest.approx(m_split["actor/pg_loss"], abs=1e-6)
    for (name, a), b in zip(whole.model.named_parameters(), split.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_kl_to_a_frozen_reference_and_entropy_bonus():
    algorithm = AlgorithmSection(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01)
    model = tiny_causal_lm()
    opt = _optimizer(model, algorithm=algorithm, lr=1e-2)
    first = opt.step(_trials(model, temperature=1.0, seed=0))
    assert first["actor/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the reference is the start
    second = opt.step(_trials(model, temperature=1.0, seed=1, prefix="u"))
    assert second["actor/kl_ref"] > 1e-5
    assert opt.ref_scorer is not None
    ref = opt.ref_scorer.model
    assert all(not p.requires_grad for p in ref.parameters())
    start = tiny_causal_lm()
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), start.parameters(), strict=True))


def test_gae_trains_a_value_head_through_verls_value_loss():
    algorithm = AlgorithmSection(adv_estimator="gae")
    model = tiny_causal_lm()
    opt = _optimizer(model, algorithm=algorithm, lr=3e-3)
    assert opt.value_head is not None
    losses = [
        opt.step(_trials(model, temperature=1.0, seed=s, prefix=f"v{s}"))["critic/vf_loss"]
        for s in range(5)
    ]
    assert losses[-1] < 0.5 * losses[0], losses


def test_unknown_algorithm_names_fail_at_construction_with_the_registered_ones():
    with pytest.raises(ConfigError, match="gspo"):
        _optimizer(algorithm=AlgorithmSection(policy_loss="ppo-clip"))
    with pytest.raises(ConfigError, match="grpo"):
        _optimizer(algorithm=AlgorithmSection(adv_estimator="grpo2"))
    # registered in verl, but needs greedy-rollout baselines this trainer does not produce
    with pytest.raises(ConfigError, match="reward_baselines"):
        _optimizer(algorithm=AlgorithmSection(adv_estimator="remax"))


def test_a_batch_of_only_failures_and_zero_variance_groups_skips_the_update():
    model = tiny_causal_lm()
    opt = _optimizer(model)
    trials = _trials(model, temperature=1.0)
    same = [attrs.evolve(t, reward=attrs.evolve(t.reward, value=1.0)) for t in trials[:6]]
    infra = [attrs.evolve(t, termination="sandbox_error") for t in trials[6:]]
    before = [p.detach().clone() for p in opt.model.parameters()]
    metrics = opt.step(same + infra)
    assert metrics["update/skipped"] == 1
    assert metrics["groups/zero_variance"] == 1
    assert metrics["trials/excluded_infra"] == len(infra)
    assert all(torch.equal(a, b) for a, b in zip(before, opt.model.parameters(), strict=True))


def test_checkpoint_resume_is_exact(tmp_path):
    """save, step == load, step: parameters, optimizer state and shuffling all restored."""
    options = {"ppo_mini_batch_size": 2, "seed": 7}
    algorithm = AlgorithmSection(use_kl_loss=True, kl_loss_coef=0.05)
    data = tiny_causal_lm(seed=4)
    batch1 = _trials(data, temperature=1.0, seed=1, prefix="a")
    batch2 = _trials(data, temperature=1.0, seed=2, prefix="b")
    run = RunDir.create(tmp_path, "ckpt", "")

    a = _optimizer(tiny_causal_lm(seed=4), algorithm=algorithm, **options)
    a.step(batch1)
    checkpoints.write_checkpoint(
        run, 1, save=a.save, metrics={}, servable_weights=a.servable_weights
    )
    assert checkpoints.latest_checkpoint(run) == checkpoints.checkpoint_dir(run, 1)
    assert checkpoints.read_state(checkpoints.checkpoint_dir(run, 1)).servable_weights == "policy"
    a_metrics = a.step(batch2)

    b = _optimizer(tiny_causal_lm(seed=4), algorithm=algorithm, **options)
    b.load(checkpoints.latest_checkpoint(run))
    assert b.steps == 1 and b.updates == 2
    b_metrics = b.step(batch2)

    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert a_metrics["actor/pg_loss"] == b_metrics["actor/pg_loss"]
    sa, sb = a.optim.state_dict()["state"], b.optim.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)

    # a resumed optimizer that skipped load would differ: the test can fail
    c = _optimizer(tiny_causal_lm(seed=4), algorithm=algorithm, **options)
    c.step(batch2)
    assert not all(
        torch.equal(pa, pc)
        for pa, pc in zip(a.model.parameters(), c.model.parameters(), strict=True)
    )


def test_checkpoint_policy_folder_loads_as_a_model_and_incomplete_ones_are_refused(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_causal_lm()
    opt = _optimizer(model)
    opt.step(_trials(model, temperature=1.0))
    path = checkpoints.write_checkpoint(tmp_path, 1, save=opt.save, metrics={})
    loaded = AutoModelForCausalLM.from_pretrained(opt.servable_weights(path))
    for (name, a), b in zip(
        opt.model.state_dict().items(), loaded.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    exported = opt.export_weights()
    assert exported.keys() == opt.model.state_dict().keys()
    assert all(torch.equal(exported[k], v) for k, v in opt.model.state_dict().items())

    (path / checkpoints.COMPLETE).unlink()
    with pytest.raises(UsageError, match="incomplete"):
        _optimizer().load(path)


def test_from_config_loads_the_model_folder_with_the_rollout_temperature(tmp_path):
    from slr.config import Config, PluginChoice, RolloutSection

    tiny_causal_lm(seed=3).save_pretrained(tmp_path / "model")
    options = TorchOptimizerConfig(model=str(tmp_path / "model"), lr=1e-4)
    cfg = Config(
        optimizer=PluginChoice(name="torch", options=options),
        rollout=RolloutSection(temperature=0.8),
        algorithm=AlgorithmSection(policy_loss="gspo", loss_agg_mode="seq-mean-token-mean"),
        **{s: PluginChoice(name="unused") for s in ("agent", "backend", "engine", "verifier")},
    )
    registration = PluginManager().get("optimizer", "torch")
    opt = registration.create(cfg.optimizer.options, config=cfg)
    assert isinstance(opt, TorchOptimizer)
    assert opt.temperature == 0.8
    assert opt.actor_cfg.policy_loss.loss_mode == "gspo"
    assert opt.optim.param_groups[0]["lr"] == 1e-4
    start = tiny_causal_lm(seed=3)
    assert all(
        torch.equal(a, b) for a, b in zip(opt.model.parameters(), start.parameters(), strict=True)
    )
    metrics = opt.step(_trials(start, temperature=0.8))
    assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4


def test_the_readme_documents_every_option():
    from pathlib import Path

    readme = (
        Path(__file__).resolve().parents[3] / "plugins" / "optimizer-torch" / "README.md"
    ).read_text()
    for field in attrs.fields(TorchOptimizerConfig):
        assert f"| `{field.name}` |" in readme, field.name
        assert field.metadata["doc"] in readme, field.name


def test_rollout_logprobs_as_the_ratio_denominator_engage_the_clip():
    """old_logprobs = rollout: off-policy tokens (here: sampled hotter) are ratio-clipped."""
    model = tiny_causal_lm(init_std=0.3)
    trials = _trials(model, temperature=0.5)
    recompute = _optimizer(model, temperature=1.0).step(trials)
    rollout = _optimizer(model, temperature=1.0, old_logprobs="rollout").step(trials)
    assert recompute["actor/pg_clipfrac"] == 0.0 and recompute["actor/ppo_kl"] == 0.0
    assert rollout["actor/pg_clipfrac"] > 0.05
    assert rollout["actor/ppo_kl"] != 0.0


def test_gradient_checkpointing_gives_the_same_update():
    trials = _trials(tiny_causal_lm(), temperature=1.0)
    plain = _optimizer()
    checkpointed = _optimizer(gradient_checkpointing=True)
    plain.step(trials)
    checkpointed.step(trials)
    for a, b in zip(plain.model.parameters(), checkpointed.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
