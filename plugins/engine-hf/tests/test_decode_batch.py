"""The decode loop's batching at many sessions: the in-place KV cache and the batched
softmax change what a step costs, never what it computes."""

from __future__ import annotations

import pytest
import torch
from slr_engine_hf.batch import Batch, GrowingLayer, make_cache
from slr_engine_hf.prefill import prefill
from slr_engine_hf.sampling import new_generator, sample_rows

from slr.contracts import SamplingParams

pytestmark = pytest.mark.timeout(60)


def test_a_growing_layer_holds_what_torch_cat_would_and_grows_past_its_room():
    keys = torch.randn(3, 2, 5, 4)
    values = torch.randn(3, 2, 5, 4)
    layer = GrowingLayer(keys, values, room=2)
    expect_k, expect_v = keys, values
    for _ in range(7):  # past the 2 free slots: the buffer doubles, twice
        k, v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        got_k, got_v = layer.update(k, v)
        expect_k, expect_v = torch.cat([expect_k, k], dim=2), torch.cat([expect_v, v], dim=2)
        assert torch.equal(got_k, expect_k) and torch.equal(got_v, expect_v)
    assert layer.get_seq_length() == 12


def test_batched_decoding_on_the_growing_cache_gives_the_logits_of_the_copying_one(
    tiny_pair, monkeypatch
):
    """Rows of different lengths (padding), many steps past the cache's free room: every
    step's logits are those of the same batch on transformers' own cache."""
    monkeypatch.setattr("slr_engine_hf.batch.DECODE_ROOM", 2)
    model, _ = tiny_pair
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    grown, copied = Batch(), Batch()
    for p in prompts:
        _, kv, _ = prefill(model, p, None, 0)
        grown.add(kv)
        copied.add(kv)
    tokens = [[p[-1]] for p in prompts]
    for step in range(7):  # past the 2 free slots: the buffers double twice on the way
        nxt = [t[-1] for t in tokens]
        positions = [len(p) + len(t) - 1 for p, t in zip(prompts, tokens, strict=True)]
        a, _ = grown.step(model, nxt, positions)
        # the reference: rebuild transformers' DynamicCache from the same tensors each step
        copied._cache = make_cache(copied.kv or [])
        copied._kv = None
        b, _ = copied.step(model, nxt, positions)
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"step {step}")
        for row, t in enumerate(tokens):
            t.append(int(torch.argmax(a[row])))
    assert isinstance(grown._cache.layers[0], GrowingLayer)  # pyright: ignore[reportOptionalMemberAccess]


def test_a_batch_samples_each_row_exactly_as_that_row_alone():
    torch.manual_seed(0)
    logits = torch.randn(6, 49152) * 3
    params = [
        SamplingParams(temperature=1.0, seed=1),
        SamplingParams(temperature=0.7, seed=2),
        SamplingParams(temperature=0.0, seed=3),
        SamplingParams(temperature=1.0, top_k=20, seed=4),
        SamplingParams(temperature=1.0, top_p=0.9, seed=5),
        SamplingParams(temperature=1.3, seed=6),
    ]
    together = sample_rows(logits, params, [new_generator(p.seed) for p in params])
    alone = [
        sample_rows(logits[i : i + 1], [p], [new_generator(p.seed)]) for i, p in enumerate(params)
    ]
    assert together == ([t[0][0] for t in alone], [t[1][0] for t in alone])


def test_rows_leave_the_growing_cache_in_place_and_the_rest_decode_as_before(tiny_pair):
    """The longest row and a middle one leave (their columns stay, as padding), a new row
    joins later (the merge drops them): every step's logits are those of a batch rebuilt
    from scratch at each change, on transformers' own cache."""
    model, _ = tiny_pair
    prompts = [list(range(5, 45)), [12, 13, 14, 15, 16], list(range(60, 72)), [20, 21, 22]]
    grown, rebuilt = Batch(), Batch()
    for p in prompts:
        _, kv, _ = prefill(model, p, None, 0)
        grown.add(kv)
        rebuilt.add(kv)
    assert grown.lengths == [40, 12, 5, 3]
    fed = [[p[-1]] for p in sorted(prompts, key=len, reverse=True)]
    positions = sorted(len(p) - 1 for p in prompts)[::-1]

    def step(label):
        a, _ = grown.step(model, [t[-1] for t in fed], positions)
        rebuilt._cache = make_cache(rebuilt.kv or [])  # a DynamicLayer cache: rebuilt on keep
        rebuilt._kv = None
        b, _ = rebuilt.step(model, [t[-1] for t in fed], positions)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=label)
        for i, t in enumerate(fed):
            t.append(int(torch.argmax(a[i])))
            positions[i] += 1

    step("before")
    columns = grown.columns
    for batch in (grown, rebuilt):
        batch.keep([1, 3])
    fed, positions = [fed[1], fed[3]], [positions[1], positions[3]]
    assert grown.columns == columns and rebuilt.columns < columns  # kept in place / trimmed
    assert isinstance(grown._cache.layers[0], GrowingLayer)  # pyright: ignore[reportOptionalMemberAccess]
    for i in range(3):
        step(f"after leaving {i}")
    _, kv, _ = prefill(model, [30, 31, 32, 33, 34, 35, 36, 37], None, 0)
    for batch in (grown, rebuilt):
        assert batch.add(kv) == 1
    fed.insert(1, [37])
    positions.insert(1, 7)
    step("after a join")
    assert grown.columns == grown.width  # the merge dropped the leftover columns
