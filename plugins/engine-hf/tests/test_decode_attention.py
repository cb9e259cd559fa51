"""The decode step's attention (``slr_engine_hf.attention``): grouped-query heads read the
cache in place, rows attend in buckets of similar length; it changes what a step costs,
not what it computes."""

from __future__ import annotations

import pytest
import torch
from slr_engine_hf.attention import NAME, DecodePlan, use_decode_attention
from slr_engine_hf.batch import Batch
from slr_engine_hf.prefill import prefill

from slr_testkit import tiny

pytestmark = pytest.mark.timeout(60)


def test_a_plan_buckets_rows_of_similar_length_and_covers_every_row_once():
    lengths = [2000, 1990, 1985, 300, 290, 20, 10]
    plan = DecodePlan.for_lengths(lengths, width=2000)
    rows = [r for start, end, _ in plan.buckets for r in range(start, end)]
    assert rows == list(range(len(lengths)))
    assert plan.buckets[0] == (0, 3, 0)  # the long rows together, over every column
    # no short row attends over the long rows' columns
    for start, end, column in plan.buckets[1:]:
        assert column >= 2000 - 300 and 2000 - column == max(lengths[start:end])
    # equal rows: one bucket, no wasted column
    assert DecodePlan.for_lengths([64] * 32, width=64).buckets == ((0, 32, 0),)


def test_rows_are_kept_longest_first_whatever_order_they_join_in(tiny_pair):
    model, _ = tiny_pair
    batch = Batch()
    rows = [batch.add(prefill(model, list(range(5, 5 + n)), None, 0)[1]) for n in (3, 9, 5, 9)]
    assert rows == [0, 0, 1, 1]  # a tie goes after the row already there
    assert batch.lengths == [9, 9, 5, 3]
    assert batch.mask is not None and batch.mask.sum(dim=1).tolist() == [9, 9, 5, 3]


@pytest.mark.parametrize("kv_heads", [1, 4])  # 4 query heads per key / value head, and 1
def test_bucketed_decoding_gives_the_logits_of_transformers_sdpa(tiny_pair, kv_heads):
    """Rows of very different lengths (several buckets, padding inside each), several
    steps: the logits are those of the same batch through transformers' sdpa."""
    model, _ = tiny.tiny_model(kv_heads=kv_heads, heads=4, seed=1, tok=tiny_pair[1])
    prompts = [list(range(40, 40 + n)) for n in (400, 390, 100, 12, 7)]
    ours, theirs = Batch(), Batch()
    for p in prompts:
        _, kv, _ = prefill(model, p, None, 0)
        ours.add(kv)
        theirs.add(kv)
    plan = DecodePlan.for_lengths([n + 1 for n in ours.lengths], ours.width + 1)
    assert len(plan.buckets) >= 2
    tokens = [[5] for _ in prompts]
    lengths = sorted((len(p) for p in prompts), reverse=True)
    for step in range(3):
        nxt = [t[-1] for t in tokens]
        positions = [n + step for n in lengths]
        model.set_attn_implementation(NAME)
        a, _ = ours.step(model, nxt, positions)
        model.set_attn_implementation("sdpa")
        b, _ = theirs.step(model, nxt, positions)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        for row, t in enumerate(tokens):
            t.append(int(torch.argmax(b[row])))


def test_the_engine_uses_it_only_for_models_on_sdpa(tiny_pair):
    model, _ = tiny.tiny_model(seed=2, tok=tiny_pair[1])
    assert use_decode_attention(model) and model.config._attn_implementation == NAME
    model.set_attn_implementation("eager")
    assert not use_decode_attention(model) and model.config._attn_implementation == "eager"
