"""The served folder's config says the dtype its tensors are stored in (verl's checkpoint
manager writes ``bfloat16`` there whatever they are); read from the safetensors headers."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file
from slr_optimizer_verl.checkpoint import match_config_dtype, tensor_dtype


def _folder(tmp_path, dtypes: dict[str, torch.dtype], config: dict):
    tensors = {name: torch.zeros(2, 3, dtype=dtype) for name, dtype in dtypes.items()}
    tensors["step"] = torch.zeros(1, dtype=torch.int64)  # not a floating type: ignored
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_bf16_config_over_fp32_tensors_is_set_to_float32(tmp_path):
    folder = _folder(
        tmp_path,
        {"a": torch.float32, "b": torch.float32},
        {"model_type": "llama", "dtype": "bfloat16", "torch_dtype": "bfloat16"},
    )
    assert tensor_dtype(folder) == "float32"
    match_config_dtype(folder)
    config = json.loads((folder / "config.json").read_text())
    assert (config["dtype"], config["torch_dtype"], config["model_type"]) == (
        "float32",
        "float32",
        "llama",
    )


def test_mixed_tensor_dtypes_leave_the_config_as_it_is(tmp_path):
    folder = _folder(tmp_path, {"a": torch.float32, "b": torch.bfloat16}, {"dtype": "bfloat16"})
    assert tensor_dtype(folder) is None
    match_config_dtype(folder)
    assert json.loads((folder / "config.json").read_text()) == {"dtype": "bfloat16"}
