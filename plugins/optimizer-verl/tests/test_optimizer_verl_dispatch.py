"""How a batch is split over the ranks of the verl worker group (``dispatch.for_ranks``) and
how weights are bucketed (``weights.plan_buckets``), without starting any rank: verl's
balanced partitions, filler rows that carry no loss token, and outputs that come back in
the caller's order."""

from __future__ import annotations

import pytest
import torch
from slr_optimizer_verl import dispatch
from slr_optimizer_verl.weights import plan_buckets


def _batch(lengths: list[int], response: int = 3):
    """A no-padding batch (verl's left_right_2_no_padding) of rows of these lengths."""
    from tensordict import TensorDict
    from verl.workers.utils.padding import left_right_2_no_padding

    n, width = len(lengths), max(lengths)
    prompt = width - response
    attention = torch.zeros((n, width), dtype=torch.long)
    for i, length in enumerate(lengths):
        attention[i, prompt - (length - response) :] = 1
    ids = torch.arange(n * width).reshape(n, width) % 97 + 1
    td = TensorDict(
        {
            "prompts": ids[:, :prompt],
            "responses": ids[:, prompt:],
            "input_ids": ids,
            "attention_mask": attention,
            "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0),
            "response_mask": torch.ones((n, response)),
            "row": torch.arange(n),
        },
        batch_size=[n],
    )
    return left_right_2_no_padding(td)


@pytest.mark.parametrize("ranks", [2, 3])
def test_rows_are_spread_evenly_and_come_back_in_order(ranks):
    from verl.utils import tensordict_utils as tu

    lengths = [40, 5, 33, 7, 21, 12, 9]
    td = _batch(lengths)
    tu.assign_non_tensor(td, temperature=0.7)
    spread, keep = dispatch.for_ranks(td, ranks)

    size = len(spread)
    assert size % ranks == 0 and size - len(lengths) < ranks
    # fillers: the shortest rows again, with no policy token
    fillers = [slot for slot in range(size) if slot not in set(keep.tolist())]
    assert len(fillers) == size - len(lengths)
    for slot in fillers:
        assert float(spread["response_mask"][slot].sum()) == 0.0
        assert float(spread["loss_mask"][slot].sum()) == 0.0
    assert float(spread["response_mask"].sum()) == float(td["response_mask"].sum())
    # every original row once, at the slot keep names, unchanged
    assert spread["row"][keep].tolist() == list(range(len(lengths)))
    assert torch.equal(spread["response_mask"][keep], td["response_mask"])
    assert tu.get(spread, "temperature") == 0.7
    # verl's balanced partitions: each rank's share of the tokens is close to even
    per_rank = dispatch.row_lengths(spread).reshape(ranks, -1).sum(dim=1)
    assert int(per_rank.max() - per_rank.min()) <= max(lengths)
    # an output per slot comes back in the caller's order without the fillers
    out = tu.index_select_tensor_dict(spread, keep)
    assert out["row"].tolist() == list(range(len(lengths)))


def test_a_batch_smaller_than_the_group_is_filled():
    spread, keep = dispatch.for_ranks(_batch([9]), 2)
    assert len(spread) == 2 and keep.tolist() in ([0], [1])
    assert float(spread["loss_mask"].sum()) == float(spread["response_mask"][keep].sum())


def test_a_padded_batch_is_refused_by_name():
    from tensordict import TensorDict

    td = TensorDict({"input_ids": torch.ones((2, 4), dtype=torch.long)}, batch_size=[2])
    with pytest.raises(ValueError, match="no-padding"):
        dispatch.for_ranks(td, 2)


def test_buckets_hold_at_most_the_limit_and_keep_the_order():
    sizes = [("a", 40), ("b", 30), ("c", 100), ("d", 10), ("e", 20), ("f", 5)]
    buckets = plan_buckets(sizes, 64)
    assert buckets == [["a"], ["b"], ["c"], ["d", "e", "f"]]
    assert [n for bucket in buckets for n in bucket] == [n for n, _ in sizes]
