"""``WeightUpdate``: a mapping that keeps its kind across process boundaries, counts its
bytes, refuses adapter updates that are not adapters, and the adapter folder round trip."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from slr.contracts.weights import (
    LoraSpec,
    WeightUpdate,
    buckets,
    is_lora,
    portable,
    require_full,
    sync_metrics,
)
from slr.engines.lora import PREFIX, is_adapter_folder, read_adapter, write_adapter

SPEC = LoraSpec(rank=2, alpha=4, modules=("a.q_proj",), base_model="base")


def _lora() -> WeightUpdate:
    tensors = {
        "a.q_proj.lora_A.weight": torch.ones(2, 3),
        "a.q_proj.lora_B.weight": torch.ones(5, 2),
    }
    return WeightUpdate(tensors=tensors, kind="lora", lora=SPEC)


def test_a_lora_update_is_a_mapping_that_keeps_its_kind_through_pickle():
    update = _lora()
    assert dict(update).keys() == {"a.q_proj.lora_A.weight", "a.q_proj.lora_B.weight"}
    assert update.nbytes == (6 + 10) * 4
    assert SPEC.scaling == 2.0
    again = pickle.loads(pickle.dumps(portable(update)))  # what Ray's object store does
    assert is_lora(again) and again.lora == SPEC
    assert portable({"w": torch.zeros(1)}).__class__ is dict
    assert sync_metrics(update) == {"sync/bytes": 64.0, "sync/lora": 1.0}
    assert sync_metrics({"w": torch.zeros(4)}) == {"sync/bytes": 16.0, "sync/lora": 0.0}
    assert sync_metrics(object()) == {}  # a reference to weights held elsewhere


def test_malformed_updates_and_engines_without_adapters_say_so():
    with pytest.raises(ValueError, match="needs a LoraSpec"):
        WeightUpdate(tensors={}, kind="lora")
    with pytest.raises(ValueError, match="only adapter matrices"):
        WeightUpdate(tensors={"a.weight": torch.ones(1)}, kind="lora", lora=SPEC)
    assert require_full({"w": 1}, engine="x") == {"w": 1}
    with pytest.raises(NotImplementedError, match="the sglang engine cannot apply a LoRA"):
        require_full(_lora(), engine="sglang")


def test_the_adapter_folder_is_pefts_format_and_reads_back(tmp_path):
    folder = write_adapter(tmp_path / "adapter", _lora())
    assert is_adapter_folder(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 2, 4.0)
    assert config["target_modules"] == ["a.q_proj"] and config["base_model_name_or_path"] == "base"
    from safetensors import safe_open

    with safe_open(str(folder / "adapter_model.safetensors"), "pt") as f:
        assert all(k.startswith(PREFIX) for k in f.keys())
    back = read_adapter(folder)
    assert back.lora == SPEC
    assert all(torch.equal(back[k], v) for k, v in _lora().items())


class _Gathered(dict):
    """A mapping that records which tensors were read, as a lazily gathered export does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: list[str] = []

    def __getitem__(self, key):
        self.read.append(key)
        return super().__getitem__(key)


def test_buckets_keep_order_bound_bytes_and_read_one_bucket_ahead_at_most():
    weights = _Gathered(
        a=torch.zeros(10),  # 40 bytes each in float32
        b=torch.zeros(10),
        c=torch.zeros(100),  # 400 bytes: over the limit, a bucket of its own
        d=torch.zeros(10, dtype=torch.bfloat16),  # 20 bytes
    )
    out = buckets(weights, 100)
    first = next(out)
    assert [n for n, _ in first] == ["a", "b"] and weights.read == ["a", "b", "c"]
    rest = [[n for n, _ in bucket] for bucket in out]
    assert rest == [["c"], ["d"]]
    with pytest.raises(ValueError, match="at least one byte"):
        next(buckets(weights, 0))
