"""What the verl optimizer writes into a checkpoint folder.

::

    step-000012/
      verl/                verl's checkpoint manager's folder (FSDPCheckpointManager):
        model_world_size_1_rank_0.pt, optim_..., extra_state_... (sharded state, per rank;
                           with LoRA the adapter's alone: verl's save_lora_only)
        huggingface/       a Hugging Face model folder (the optimizer's servable_weights;
                           not written with LoRA)
      adapter/             LoRA only: the adapter as a peft folder (slr.lora), the
                           servable weights, over the base model it names
      critic/              gae only: the critic worker's checkpoint manager's folder
      trainer_state.json   step and update counts, the shuffling generator, options

The folder around these (its name, the ``COMPLETE`` marker, the loop's state) is
``slr.checkpoints``'s; ``load`` refuses a folder without the marker.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from slr.checkpoints import require_complete
from slr.config.structure import unstructure
from slr.errors import UsageError
from slr.lora import is_adapter_folder, write_adapter
from slr.runs import atomic_write

VERL = "verl"
"""verl's checkpoint manager's folder inside a checkpoint."""
HF = "huggingface"
"""Where verl's checkpoint manager writes the Hugging Face model (``hf_model``)."""
ADAPTER = "adapter"
"""The LoRA adapter folder (``slr.lora``'s peft format) of a LoRA run."""
CRITIC = "critic"
"""The critic worker's checkpoint manager's folder (gae)."""
STATE = "trainer_state.json"


def servable_weights(path: Path) -> Path:
    """What an engine serves from a checkpoint: the adapter folder of a LoRA run, else the
    Hugging Face model verl's manager wrote."""
    adapter = Path(path) / ADAPTER
    if is_adapter_folder(adapter):
        return adapter
    return Path(path) / VERL / HF


def save(opt: Any, path: Path) -> None:
    """Write ``opt``'s files into the checkpoint folder ``path`` through verl's manager."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    target = path / VERL
    if target.exists():
        shutil.rmtree(target)
    opt.group.save(str(target), step=opt.steps)
    if opt.lora is not None:
        adapter = path / ADAPTER
        if adapter.exists():
            shutil.rmtree(adapter)
        write_adapter(adapter, opt.export_weights())
    if opt.critic is not None:
        critic = path / CRITIC
        if critic.exists():
            shutil.rmtree(critic)
        opt.critic.save(str(critic), step=opt.steps)
    shuffle = opt.generator.get_state().numpy().tobytes()
    state = {
        "steps": opt.steps,
        "updates": opt.updates,
        "temperature": opt.temperature,
        "shuffle": base64.b64encode(shuffle).decode("ascii"),
        "algorithm": unstructure(opt.algorithm),
        "options": unstructure(opt.options),
    }
    atomic_write(path / STATE, json.dumps(state, indent=2, sort_keys=True))


def load(opt: Any, path: Path) -> None:
    """Restore what ``save`` wrote into ``opt`` (refuses an incomplete checkpoint)."""
    path = Path(path)
    require_complete(path)
    target = path / VERL
    if not (path / STATE).is_file() or not target.is_dir():
        raise UsageError(
            f"checkpoint {str(path)!r} was not written by the verl optimizer (no {VERL}/ or "
            f"{STATE}); resume it with the optimizer that wrote it"
        )
    if (opt.lora is not None) != is_adapter_folder(path / ADAPTER):
        raise UsageError(
            f"checkpoint {str(path)!r} was written "
            f"{'without' if opt.lora is not None else 'with'} a LoRA adapter; resume it with "
            f"the run's own [optimizer] lora_rank"
        )
    if opt.critic is not None and not (path / CRITIC).is_dir():
        raise UsageError(
            f"checkpoint {str(path)!r} has no critic ({CRITIC}/): it was not written by a gae "
            f"run; resume it with the run's own [algorithm] adv_estimator"
        )
    opt.group.load(str(target))
    if opt.critic is not None:
        opt.critic.load(str(path / CRITIC))
    saved = json.loads((path / STATE).read_text())
    opt.steps, opt.updates = int(saved["steps"]), int(saved["updates"])
    shuffle = base64.b64decode(saved["shuffle"])
    opt.generator.set_state(torch.frombuffer(bytearray(shuffle), dtype=torch.uint8))
