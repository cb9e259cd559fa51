"""Trials to verl's layout: each row split at its first policy token into left-padded prompts
and right-padded responses, tool output inside a response masked out, per-token tensors in
the response columns, and verl's own padding removal and restoration giving them back."""

from __future__ import annotations

import torch
from slr_optimizer_torch import batch as batching
from slr_optimizer_torch.testing import trial
from slr_optimizer_verl.batch import Layout, to_verl


def _trials():
    # a multi-turn segment (policy, tool output, policy), a short one, and one whose first
    # token is a policy token (unscorable: nothing precedes it)
    a = ([5, 6, 7, 8, 9, 10, 11, 12], [0, 0, 1, 1, 0, 0, 1, 1], [0, 0, -1, -2, 0, 0, -3, -4])
    b = ([5, 6, 7, 20, 21], [0, 0, 0, 1, 1], [0, 0, 0, -5, -6])
    c = ([30, 31, 32], [1, 1, 1], [-7, -8, -9])
    return [
        trial("a", "g", [a], 1.0),
        trial("b", "g", [b], 0.0),
        trial("c", "h", [c], 1.0),
    ]


def test_rows_split_at_the_first_policy_token():
    tb = batching.assemble(_trials(), drop_zero_variance_groups=False)
    layout = Layout.of(tb)
    assert layout.first.tolist() == [2, 3, 1]
    td = to_verl(tb, range(tb.num_sequences), layout=layout)
    pad = batching.PAD_ID
    assert td["prompts"].tolist() == [[pad, 5, 6], [5, 6, 7], [pad, pad, 30]]
    assert td["responses"].tolist() == [
        [7, 8, 9, 10, 11, 12],
        [20, 21, pad, pad, pad, pad],
        [31, 32, pad, pad, pad, pad],
    ]
    assert td["response_mask"].tolist() == [
        [1, 1, 0, 0, 1, 1],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
    ]
    assert td["rollout_log_probs"][0].tolist() == [-1, -2, 0, 0, -3, -4]
    assert td["rollout_log_probs"][2].tolist() == [-8, -9, 0, 0, 0, 0]
    assert td["attention_mask"][1].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert td["position_ids"][0].tolist()[1:9] == list(range(8))
    assert torch.equal(td["input_ids"], torch.cat([td["prompts"], td["responses"]], dim=1))


def test_advantages_and_old_logprobs_follow_their_tokens_and_come_back():
    tb = batching.assemble(_trials(), drop_zero_variance_groups=False)
    tb.advantages = torch.arange(tb.response_mask.numel(), dtype=torch.float32).reshape(
        tb.response_mask.shape
    )
    layout = Layout.of(tb)
    rows = [0, 2]
    td = to_verl(tb, rows, old_log_probs=tb.rollout_logprobs, layout=layout)
    # token j+1 of row r is scored in torch column j: response column k = token first + k
    for i, row in enumerate(rows):
        first = int(layout.first[row])
        for k in range(int(layout.length[row]) - first):
            assert td["advantages"][i, k] == tb.advantages[row, first + k - 1]
    back = layout.shifted(td["old_log_probs"], rows, tb.response_mask.shape[1])
    assert torch.equal(back, tb.rollout_logprobs[rows])


def test_verls_padding_removal_round_trips_a_per_token_tensor():
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    tb = batching.assemble(_trials(), drop_zero_variance_groups=False)
    rows = list(range(tb.num_sequences))
    td = to_verl(tb, rows)
    responses = td["responses"].clone()
    no_pad = left_right_2_no_padding(td)
    # a model output that is each position's *next* input token: verl's shift must give the
    # response tokens back in place
    next_tokens = torch.cat(
        [torch.cat([row[1:], row[:1]]) for row in no_pad["input_ids"].unbind()]
    ).float()
    restored = no_padding_2_padding(next_tokens, no_pad)
    mask = td["response_mask"] > 0
    assert torch.equal(restored[mask].long(), responses[mask])
