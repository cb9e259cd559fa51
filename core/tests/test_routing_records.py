"""Routed experts in records: one compact array per segment, on disk as one base64 string,
read back exactly on both record paths; routing in the layouts earlier versions wrote loads.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from slr.contracts import RoutedExperts, Segment, Trajectory, TrialResult, from_dict, to_dict
from slr.contracts.routing import from_legacy, merge_call
from slr.contracts.serialize import decode, encode

RNG = np.random.default_rng(0)


def _lists(tokens: int, layers: int = 3, top_k: int = 2, experts: int = 8) -> list:
    return RNG.integers(0, experts, size=(tokens, layers, top_k)).tolist()


def _trial(routing, logprob: float = -0.5) -> TrialResult:
    n = 40
    seg = Segment(
        token_ids=list(range(n)),
        loss_mask=[0] * 10 + [1] * (n - 10),
        logprobs=[0.0] * 10 + [logprob] * (n - 10),
        routed_experts=routing,
    )
    return TrialResult(
        trial_id="t",
        task_id="x",
        termination="completed",
        trajectory=Trajectory(session_id="s", segments=[seg], num_calls=1),
    )


def test_lists_convert_to_a_compact_array_and_back():
    lists = _lists(7)
    r = RoutedExperts.from_lists(lists)
    assert (len(r), r.layers, r.top_k, r.dtype) == (7, 3, 2, "uint8")
    assert len(r.data) == 7 * 3 * 2  # one byte per expert id
    assert r.tolist() == lists
    assert r[2:5].tolist() == lists[2:5]
    assert (r[:2] + r[2:]).tolist() == lists
    wide = RoutedExperts.from_lists([[[300, 1], [2, 3], [4, 5]]])
    assert wide.dtype == "uint16" and (r + wide).tolist() == [*lists, *wide.tolist()]
    with pytest.raises(ValueError, match="ragged"):
        RoutedExperts.from_lists([[[1, 2]], [[1]]])
    with pytest.raises(ValueError, match="cannot join"):
        r + RoutedExperts.from_lists([[[1, 2]]])


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32"])
def test_vllm_npy_arrays_read_without_numpy(dtype):
    """vLLM sends routed experts as a .npy array; it is read by header, any int width."""
    array = RNG.integers(0, 60, size=(5, 2, 4)).astype(dtype)
    buffer = io.BytesIO()
    np.save(buffer, array)
    assert RoutedExperts.from_npy(buffer.getvalue()).tolist() == array.tolist()
    with pytest.raises(ValueError, match="npy"):
        RoutedExperts.from_npy(b"not an array")


def test_records_keep_routing_as_one_base64_string_on_both_paths():
    lists = _lists(39)
    trial = _trial(lists)
    data = encode(trial)
    seg = json.loads(data)["trajectory"]["segments"][0]["routed_experts"]
    assert base64.b64decode(seg["data"]) == bytes(np.array(lists, dtype=np.uint8).ravel())
    assert decode(data, TrialResult) == trial
    assert decode(data, TrialResult).trajectory.segments[0].routed_experts.tolist() == lists
    # a non-finite log-prob takes the json path: the same form, the same record back
    odd = _trial(lists, logprob=float("-inf"))
    written = encode(odd)
    assert json.loads(written)["trajectory"]["segments"][0]["routed_experts"] == seg
    assert decode(written, TrialResult) == odd
    assert from_dict(to_dict(odd), TrialResult) == odd


def test_routing_longer_than_its_segment_is_refused():
    with pytest.raises(ValueError, match="routing is kept per token"):
        _trial(_lists(41))


def test_routing_in_earlier_layouts_loads():
    """Earlier records held nested lists: per token, or the proxy's per call (each call's
    routing from the segment's first token, None for a call without)."""
    per_token = _lists(6)
    assert from_legacy(per_token).tolist() == per_token
    call1, call2 = _lists(4), _lists(6)
    merged = from_legacy([call1, call2])
    assert merged.tolist() == [*call1, *call2[4:]]
    assert from_legacy([call1, None, call2]).tolist() == call1  # unknown after the gap
    legacy = json.loads(encode(_trial(None)))
    legacy["trajectory"]["segments"][0]["routed_experts"] = [call1, call2]
    loaded = decode(json.dumps(legacy).encode(), TrialResult)
    assert loaded.trajectory.segments[0].routed_experts == merged


def test_a_later_call_adds_only_the_tokens_it_first_ran():
    known = RoutedExperts.from_lists(_lists(4))
    call = RoutedExperts.from_lists(_lists(9))
    assert merge_call(known, call).tolist() == [*known.tolist(), *call.tolist()[4:]]
    assert merge_call(known, call[:3]) == known
