"""LoRA in the torch trainer: the adapter put on the policy, and what leaves the trainer.

With ``[optimizer] lora_rank > 0`` the policy gets a peft LoRA adapter on ``target_modules``
(``slr.engines.lora.inject``: peft's layers in place, the model keeps its class and its base weights
are frozen), so the trainer's parameter set, and so AdamW's state, is the adapter alone.
``export`` is what the engines receive: a ``WeightUpdate`` of kind ``"lora"`` holding only
the adapter's matrices; the checkpoint's ``policy/`` is the same as a peft adapter folder
(``slr.engines.lora.write_adapter``).

Dropout (``lora_dropout``) applies in the training forward only: the trainer runs its model
in eval mode so its log-probs are the engine's, and ``GradOnlyDropout`` drops only while
gradients are being recorded, never in the no-grad log-prob passes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from slr.contracts.weights import LoraSpec, WeightUpdate
from slr.engines import lora as adapter_format
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.model import resolve_model_name


class GradOnlyDropout(nn.Module):
    """Dropout while autograd records (the update's forward), identity otherwise."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p > 0 and torch.is_grad_enabled():
            return nn.functional.dropout(x, self.p, training=True)
        return x


def wrap(model: Any, options: TorchOptimizerConfig) -> LoraSpec | None:
    """Put the configured adapter on ``model`` (None and nothing done when lora_rank is 0)."""
    if options.lora_rank <= 0:
        return None
    modules = adapter_format.inject(
        model,
        rank=options.lora_rank,
        alpha=options.lora_alpha,
        target_modules=options.target_modules,
    )
    for name in modules:
        model.get_submodule(name).lora_dropout[adapter_format.ADAPTER] = GradOnlyDropout(
            options.lora_dropout
        )
    return LoraSpec(
        rank=options.lora_rank,
        alpha=options.lora_alpha,
        modules=modules,
        base_model=resolve_model_name(options.model),
    )


def export(model: Any, spec: LoraSpec) -> WeightUpdate:
    """The adapter's matrices, copied to the CPU, as a ``"lora"`` update."""
    tensors = {
        k: v.detach().to("cpu", copy=True) for k, v in adapter_format.adapter_tensors(model).items()
    }
    return WeightUpdate(tensors=tensors, kind="lora", lora=spec)
