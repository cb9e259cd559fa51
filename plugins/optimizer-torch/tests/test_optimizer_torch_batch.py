"""Batch assembly: masks, groups, exclusions, and advantages checked against verl itself.

The references call verl's estimators directly on verl's own layout: one row per trajectory,
the response after the prompt (tool-output tokens inside it masked 0), the outcome reward on
the last response token. The batch computes on its compact per-trial rows and must agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from slr_optimizer_torch import batch as batching
from slr_optimizer_torch.testing import trial
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos

# A trajectory in the agent shape: prompt, policy turn, tool output, policy turn.
PROMPT = [5, 6, 7]


def _agent_segment(turn1: list[int], tool: list[int], turn2: list[int], base: float):
    tokens = PROMPT + turn1 + tool + turn2
    mask = [0] * len(PROMPT) + [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    logprobs = [0.0 if m == 0 else base - 0.01 * i for i, m in enumerate(mask)]
    return tokens, mask, logprobs


def _verl_reference(segments, rewards, index, estimator, config, values=None):
    """verl's estimator on verl's layout: rows = trajectories, columns = response tokens."""
    width = max(len(t) - len(PROMPT) for t, _, _ in segments)
    n = len(segments)
    scores = torch.zeros(n, width)
    mask = torch.zeros(n, width)
    for i, (_, m, _) in enumerate(segments):
        resp = m[len(PROMPT) :]
        mask[i, : len(resp)] = torch.tensor(resp, dtype=torch.float32)
        scores[i, len(resp) - 1] = rewards[i]  # the last response token is a policy token
    fn = core_algos.get_adv_estimator_fn(estimator)
    if estimator == "gae":
        return fn(
            token_level_rewards=scores,
            values=values,
            response_mask=mask,
            gamma=config.gamma,
            lam=config.lam,
        )
    kwargs = dict(token_level_rewards=scores, response_mask=mask, config=config)
    if estimator != "reinforce_plus_plus":
        kwargs["index"] = np.array(index, dtype=object)
    return fn(**kwargs)


def _dataset():
    """Two groups of three; lengths and tool-output positions differ between trials."""
    g = torch.Generator().manual_seed(3)
    segments, rewards, index, trials = [], [], [], []
    for k in range(6):
        n1, nt, n2 = (int(x) for x in torch.randint(1, 5, (3,), generator=g))
        seg = _agent_segment(
            list(range(10, 10 + n1)), list(range(40, 40 + nt)), list(range(20, 20 + n2)), -0.5 - k
        )
        reward = [1.0, 0.0, 0.5, 0.0, 1.0, 1.0][k]
        group = f"g{k // 3}"
        segments.append(seg)
        rewards.append(reward)
        index.append(group)
        trials.append(trial(f"t{k}", group, [seg], reward))
    return segments, rewards, index, trials


def test_masks_rows_and_behaviour_logprobs_are_shifted_onto_the_predicting_position():
    segments, _, _, trials = _dataset()
    b = batching.assemble(trials)
    assert b.num_sequences == 6
    for row, (tokens, mask, logprobs) in enumerate(segments):
        n = len(tokens)
        assert b.input_ids[row, :n].tolist() == tokens
        assert b.attention_mask[row].tolist() == [1] * n + [0] * (b.input_ids.shape[1] - n)
        # column t scores token t + 1
        assert b.response_mask[row, : n - 1].tolist() == [float(x) for x in mask[1:]]
        assert b.response_mask[row, n - 1 :].sum() == 0
        assert torch.allclose(b.rollout_logprobs[row, : n - 1], torch.tensor(logprobs[1:]))
    assert b.stats["batch/policy_tokens"] == sum(sum(m) for _, m, _ in segments)


def test_infrastructure_failures_and_unrewarded_trials_are_excluded_and_counted():
    _, _, _, trials = _dataset()
    seg = _agent_segment([11, 12], [41], [21], -1.0)
    extra = [
        trial("infra", "g0", [seg], 0.0, termination="sandbox_error"),
        trial("verifier", "g1", [seg], None, termination="verifier_error"),
        trial("no-reward", "g1", [seg], None, termination="completed"),
        trial("timeout", "g1", [seg], 0.0, termination="agent_timeout"),  # the policy's fault
    ]
    b = batching.assemble(trials + extra)
    ids = [t.trial_id for t in b.trials]
    assert "infra" not in ids and "verifier" not in ids and "no-reward" not in ids
    assert "timeout" in ids
    assert b.stats["trials/total"] == 10
    assert b.stats["trials/excluded_infra"] == 3
    assert b.stats["termination/sandbox_error"] == 1
    assert b.stats["termination/agent_timeout"] == 1
    assert b.stats["termination/completed"] == 7
    # group g1 now has four trials; its baseline must include the timed-out one
    assert b.group_ids.count("g1") == 4


@pytest.mark.parametrize(
    ("estimator", "gamma"),
    [
        ("grpo", 1.0),
        ("rloo", 1.0),
        ("reinforce_plus_plus_baseline", 1.0),
        ("reinforce_plus_plus", 0.9),
    ],
)
def test_advantages_match_verl_on_its_own_layout(estimator, gamma):
    segments, rewards, index, trials = _dataset()
    config = AlgoConfig(adv_estimator=estimator, gamma=gamma)
    b = batching.assemble(trials)
    adv, ret = batching.compute_advantages(b, estimator, config)
    ref_adv, ref_ret = _verl_reference(segments, rewards, index, estimator, config)
    for row, (tokens, mask, _) in enumerate(segments):
        resp = torch.tensor(mask[len(PROMPT) :], dtype=torch.bool)
        ours_cols = torch.arange(len(PROMPT) - 1, len(tokens) - 1)[resp]
        assert torch.allclose(adv[row, ours_cols], ref_adv[row, : len(resp)][resp], atol=1e-5), row
        assert torch.allclose(ret[row, ours_cols], ref_ret[row, : len(resp)][resp], atol=1e-5), row
    assert adv[b.response_mask == 0].abs().sum() == 0


def test_gae_matches_verl_with_the_same_values():
    segments, rewards, index, trials = _dataset()
    config = AlgoConfig(adv_estimator="gae", gamma=0.95, lam=0.9)
    b = batching.assemble(trials)
    values = torch.randn(b.response_mask.shape, generator=torch.Generator().manual_seed(1))
    values = values * b.response_mask
    adv, ret = batching.compute_advantages(b, "gae", config, values=values)
    # verl's layout: the same values on the response tokens
    width = max(len(t) - len(PROMPT) for t, _, _ in segments)
    ref_values = torch.zeros(len(segments), width)
    for row, (tokens, _, _) in enumerate(segments):
        n = len(tokens) - len(PROMPT)
        ref_values[row, :n] = values[row, len(PROMPT) - 1 : len(tokens) - 1]
    ref_adv, ref_ret = _verl_reference(segments, rewards, index, "gae", config, values=ref_values)
    for row, (tokens, mask, _) in enumerate(segments):
        resp = torch.tensor(mask[len(PROMPT) :], dtype=torch.bool)
        cols = torch.arange(len(PROMPT) - 1, len(tokens) - 1)[resp]
        assert torch.allclose(adv[row, cols], ref_adv[row, : len(resp)][resp], atol=1e-5)
        assert torch.allclose(ret[row, cols], ref_ret[row, : len(resp)][resp], atol=1e-5)


def test_a_history_rewrite_trial_is_one_trial_with_several_sequences():
    """Two segments (the agent compacted its history): two rows, one trial in the baseline."""
    first = _agent_segment([11, 12, 13], [41, 42], [21], -1.0)
    # the rewrite: a summary replaces the earlier turns, then the policy continues
    second_tokens = [*PROMPT, 60, 61, 22, 23]
    second = (second_tokens, [0] * 5 + [1, 1], [0.0] * 5 + [-0.3, -0.4])
    trials = [
        trial("split", "g", [first, second], 1.0),
        trial("a", "g", [_agent_segment([11], [41], [21], -1.0)], 0.0),
        trial("b", "g", [_agent_segment([12], [41], [22], -1.0)], 0.0),
    ]
    b = batching.assemble(trials)
    assert b.num_sequences == 4
    assert b.seq_trial.tolist() == [0, 0, 1, 2]
    assert b.stats["trials/multi_segment"] == 1
    # the second segment is scored in its own (rewritten) context: its own row, own tokens
    assert b.input_ids[1, : len(second_tokens)].tolist() == second_tokens
    assert b.response_mask[1].tolist()[:6] == [0, 0, 0, 0, 1, 1]

    config = AlgoConfig(adv_estimator="grpo")
    adv, _ = batching.compute_advantages(b, "grpo", config)
    scores = torch.tensor([[1.0], [0.0], [0.0]])
    ref, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=scores, response_mask=torch.ones(3, 1), index=np.array(["g"] * 3)
    )
    split_adv = ref[0, 0]
    assert torch.allclose(adv[0][b.response_mask[0] > 0], split_adv)
    assert torch.allclose(adv[1][b.response_mask[1] > 0], split_adv)
    assert torch.allclose(adv[2][b.response_mask[2] > 0], ref[1, 0])

    # token-level returns run across the segments: verl on the concatenated episode
    config = AlgoConfig(adv_estimator="reinforce_plus_plus", gamma=0.8)
    _, ret = batching.compute_advantages(b, "reinforce_plus_plus", config)
    episode = [m for m in first[1][len(PROMPT) :] if m] + [1, 1]
    rewards = torch.zeros(1, len(episode))
    rewards[0, -1] = 1.0
    _, ref_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        token_level_rewards=rewards, response_mask=torch.ones(1, len(episode)), config=config
    )
    ours = torch.cat([ret[0][b.response_mask[0] > 0], ret[1][b.response_mask[1] > 0]])
    assert torch.allclose(ours, ref_ret[0])


def test_zero_variance_groups_are_dropped_or_kept_with_zero_grpo_advantage():
    seg = _agent_segment([11, 12], [41], [21], -1.0)
    trials = [trial(f"z{i}", "zero", [seg], 1.0) for i in range(3)]
    trials += [trial("s0", "signal", [seg], 1.0), trial("s1", "signal", [seg], 0.0)]
    dropped = batching.assemble(trials)
    assert dropped.stats["groups/zero_variance"] == 1
    assert dropped.stats["groups/dropped_zero_variance"] == 1
    assert dropped.stats["trials/dropped_zero_variance"] == 3
    assert dropped.group_ids == ["signal", "signal"]

    kept = batching.assemble(trials, drop_zero_variance_groups=False)
    assert kept.stats["groups/zero_variance"] == 1
    assert kept.stats["groups/dropped_zero_variance"] == 0
    adv, _ = batching.compute_advantages(kept, "grpo", AlgoConfig(adv_estimator="grpo"))
    zero_rows = [
        r for r in range(kept.num_sequences) if kept.group_ids[int(kept.seq_trial[r])] == "zero"
    ]
    assert adv[zero_rows].abs().max() == 0
    signal_rows = [r for r in range(kept.num_sequences) if r not in zero_rows]
    assert adv[signal_rows].abs().max() > 0.5


def test_micro_batches_respect_the_token_budget_and_cover_every_row_once():
    lengths = torch.tensor([30, 5, 17, 17, 64, 3, 9, 12])
    micro = batching.micro_batches(range(8), lengths, max_tokens=40)
    assert sorted(r for m in micro for r in m) == list(range(8))
    for m in micro:
        padded = len(m) * int(lengths[m].max())
        assert padded <= 40 or len(m) == 1  # an over-long row travels alone
    assert [4] in micro
    capped = batching.micro_batches(range(8), lengths, max_tokens=10_000, max_size=3)
    assert max(len(m) for m in capped) == 3


def test_mini_batches_hold_whole_groups_ppo_mini_batch_size_at_a_time():
    """verl's ppo_mini_batch_size is a size in prompts (groups), not a count of batches."""
    ids = ["a", "a", "b", "c", "b", "c", "d"]
    assert batching.mini_batches(ids, 0, None) == [[0, 1, 2, 4, 3, 5, 6]]
    assert batching.mini_batches(ids, 2, None) == [[0, 1, 2, 4], [3, 5, 6]]
    assert batching.mini_batches(ids, 9, None) == [[0, 1, 2, 4, 3, 5, 6]]
    shuffled = batching.mini_batches(ids, 1, torch.Generator().manual_seed(0))
    assert len(shuffled) == 4
    assert sorted(i for mb in shuffled for i in mb) == list(range(len(ids)))
    assert all(len({ids[i] for i in mb}) == 1 for mb in shuffled)  # one whole group each
