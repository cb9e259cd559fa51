"""What the torch optimizer writes into a checkpoint folder.

::

    step-000012/
      policy/              a Hugging Face model folder (from_pretrained loads it; the
                           optimizer's ``servable_weights``); with LoRA (lora_rank > 0) a
                           peft adapter folder instead (``slr.engines.lora``: adapter_config.json,
                           adapter_model.safetensors, naming its base model), which the hf
                           engine serves over that base
      value_head.pt        gae only
      optimizer.pt         AdamW state (of the adapter alone with LoRA)
      rng.pt               torch's RNG and the mini-batch shuffling generator
      trainer_state.json   step and update counts, temperature, algorithm and options

The folder around these files (its name, the ``COMPLETE`` marker, the loop's state, the
fsync before the marker) is ``slr.run.checkpoints``'s; ``load`` refuses a folder without the
marker, so a process killed mid-write leaves the previous checkpoint to resume from.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from slr.config import AlgorithmSection
from slr.config.structure import unstructure
from slr.contracts.weights import LoraSpec
from slr.engines.lora import is_adapter_folder, load_weights, read_adapter, write_adapter
from slr.errors import UsageError
from slr.run.checkpoints import require_complete
from slr.run.directory import atomic_write
from slr_optimizer_torch import lora
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.model import resolve_model_name, tokenizer_files

if TYPE_CHECKING:
    from transformers import PreTrainedModel

POLICY = "policy"
"""The Hugging Face model folder inside a checkpoint: what an engine serves."""


def servable_weights(path: Path) -> Path:
    return Path(path) / POLICY


class Trainer(Protocol):
    """What a checkpoint holds of a trainer (``TorchOptimizer`` is one): its parts are saved
    and loaded in place; ``steps`` and ``updates`` are restored."""

    steps: int
    updates: int

    @property
    def model(self) -> PreTrainedModel: ...
    @property
    def lora(self) -> LoraSpec | None: ...
    @property
    def value_head(self) -> nn.Module | None: ...
    @property
    def optim(self) -> torch.optim.Optimizer: ...
    @property
    def generator(self) -> torch.Generator: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def options(self) -> TorchOptimizerConfig: ...
    @property
    def algorithm(self) -> AlgorithmSection: ...
    @property
    def temperature(self) -> float: ...


def save(opt: Trainer, path: Path) -> None:
    """Write ``opt``'s files into the checkpoint folder ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    policy = servable_weights(path)
    if policy.exists():
        shutil.rmtree(policy)
    if opt.lora is not None:
        write_adapter(policy, lora.export(opt.model, opt.lora))
    else:
        opt.model.save_pretrained(policy, safe_serialization=True)
    # tokenizer and chat template too, so evaluation and engines can load the folder alone
    for file in tokenizer_files(resolve_model_name(opt.options.model)):
        if not (policy / file.name).exists():
            shutil.copy2(file, policy / file.name)
    if opt.value_head is not None:
        torch.save(opt.value_head.state_dict(), path / "value_head.pt")
    torch.save(opt.optim.state_dict(), path / "optimizer.pt")
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "shuffle": opt.generator.get_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, path / "rng.pt")
    state = {
        "steps": opt.steps,
        "updates": opt.updates,
        "temperature": opt.temperature,
        "algorithm": unstructure(opt.algorithm),
        "options": unstructure(opt.options),
    }
    atomic_write(path / "trainer_state.json", json.dumps(state, indent=2, sort_keys=True))


def load(opt: Trainer, path: Path) -> None:
    """Restore exactly what ``save`` wrote into ``opt`` (refuses an incomplete checkpoint)."""
    path = Path(path)
    require_complete(path)
    if opt.lora is not None:
        _load_adapter(opt, path)
    else:
        _load_policy(opt, path)
    if opt.value_head is not None:
        opt.value_head.load_state_dict(
            torch.load(path / "value_head.pt", map_location=opt.device, weights_only=True)
        )
    opt.optim.load_state_dict(
        torch.load(path / "optimizer.pt", map_location=opt.device, weights_only=True)
    )
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    opt.generator.set_state(rng["shuffle"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    saved = json.loads((path / "trainer_state.json").read_text())
    opt.steps, opt.updates = int(saved["steps"]), int(saved["updates"])


def _load_policy(opt: Trainer, path: Path) -> None:
    from safetensors.torch import load_file

    policy = servable_weights(path)
    if is_adapter_folder(policy):
        raise UsageError(
            f"checkpoint {str(path)!r} holds a LoRA adapter, and this optimizer trains full "
            f"weights: resume it with the run's own [optimizer] lora_rank"
        )
    state: dict[str, torch.Tensor] = {}
    for file in sorted(policy.glob("*.safetensors")):
        state.update(load_file(file, device=str(opt.device)))
    missing, unexpected = opt.model.load_state_dict(state, strict=False)
    untied = [k for k in missing if not _is_tied(opt.model, k, state)]
    if untied or unexpected:
        raise UsageError(
            f"checkpoint {str(path)!r} does not fit this model: missing {untied[:5]}, "
            f"unexpected {list(unexpected)[:5]}. Was it written for another [optimizer] model?"
        )


def _load_adapter(opt: Trainer, path: Path) -> None:
    policy = servable_weights(path)
    if not is_adapter_folder(policy):
        raise UsageError(
            f"checkpoint {str(path)!r} holds full weights, and this optimizer trains a LoRA "
            f"adapter ([optimizer] lora_rank = {opt.options.lora_rank}): resume it with "
            f"lora_rank = 0, or start a new run"
        )
    update = read_adapter(policy, device=str(opt.device))
    assert opt.lora is not None and update.lora is not None
    if (update.lora.rank, set(update.lora.modules)) != (opt.lora.rank, set(opt.lora.modules)):
        raise UsageError(
            f"checkpoint {str(path)!r} holds a rank-{update.lora.rank} adapter over "
            f"{len(update.lora.modules)} modules, this optimizer's is rank {opt.lora.rank} "
            f"over {len(opt.lora.modules)}: resume with the run's own lora_rank and "
            f"target_modules"
        )
    load_weights(opt.model, update)


def _is_tied(model: nn.Module, key: str, loaded: Mapping[str, torch.Tensor]) -> bool:
    """A key save_pretrained left out because it shares storage with a saved one."""
    params = dict(model.named_parameters(remove_duplicate=False))
    if key not in params:
        return False
    return any(other in loaded and params[other] is params[key] for other in params if other != key)
