"""LoRA in the verl optimizer: what leaves the trainer when only an adapter trains.

With ``[optimizer] lora_rank > 0`` verl's FSDP engine puts a peft LoRA adapter on the
policy (``HFModelConfig.lora_rank`` / ``lora_alpha`` / ``target_modules``, verl's
``_build_lora_module``), so its AdamW holds the adapter alone. The engines receive only the
adapter: a ``WeightUpdate`` of kind ``"lora"`` keyed as ``slr.engines.lora`` names it (``<module>
.lora_A.weight``, the base model's module names), gathered from the FSDP shards one tensor at
a time, the same update the torch optimizer exports.
"""

from __future__ import annotations

from typing import Any

import torch

from slr.contracts.weights import LoraSpec, WeightUpdate
from slr.engines import lora as adapter_format


def _full(tensor: Any) -> torch.Tensor:
    """A parameter whole on the CPU (an FSDP2 DTensor's shards gathered)."""
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().to("cpu", copy=True)


def spec(module: Any, *, rank: int, alpha: float, base_model: str) -> LoraSpec:
    """The adapter verl put on ``module`` (its peft model), by the base model's module names."""
    modules = tuple(
        name.removeprefix(adapter_format.PREFIX) for name in adapter_format.adapted_modules(module)
    )
    return LoraSpec(rank=rank, alpha=alpha, modules=modules, base_model=base_model)


def export(module: Any, lora: LoraSpec) -> WeightUpdate:
    """The adapter's matrices, gathered whole and copied to the CPU, as a ``"lora"`` update."""
    tensors = {
        key.removeprefix(adapter_format.PREFIX): _full(value)
        for key, value in adapter_format.adapter_tensors(module).items()
    }
    return WeightUpdate(tensors=tensors, kind="lora", lora=lora)
