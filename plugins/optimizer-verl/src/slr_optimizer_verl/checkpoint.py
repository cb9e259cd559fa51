"""What the verl optimizer writes into a checkpoint folder.

::

    step-000012/
      verl/                verl's checkpoint manager's folder (FSDPCheckpointManager):
        model_world_size_N_rank_R.pt, optim_..., extra_state_... (sharded state, per rank;
                           with LoRA the adapter's alone: verl's save_lora_only)
        huggingface/       a Hugging Face model folder (the optimizer's servable_weights;
                           not written with LoRA)
      adapter/             LoRA only: the adapter as a peft folder (slr.engines.lora), the
                           servable weights, over the base model it names
      critic/              gae only: the critic worker's checkpoint manager's folder
      trainer_state.json   step and update counts, the shuffling generator, options

Every rank writes its own shard files (a checkpoint is loaded at the world size that wrote
it); rank 0 writes ``huggingface/``. verl's manager writes that folder's ``config.json`` with
``dtype: bfloat16`` whatever the tensors are (it builds the model it saves from the config
in bf16), so a server reading the config would load fp32 weights as bf16: ``save`` sets the
config's dtype to the one the safetensors files hold (``match_config_dtype``).

The folder around these (its name, the ``COMPLETE`` marker, the loop's state) is
``slr.run.checkpoints``'s; ``load`` refuses a folder without the marker.
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import torch

from slr.config.structure import unstructure
from slr.engines.lora import is_adapter_folder, write_adapter
from slr.errors import UsageError
from slr.run.checkpoints import require_complete
from slr.run.directory import atomic_write

VERL = "verl"
"""verl's checkpoint manager's folder inside a checkpoint."""
HF = "huggingface"
"""Where verl's checkpoint manager writes the Hugging Face model (``hf_model``)."""
ADAPTER = "adapter"
"""The LoRA adapter folder (``slr.engines.lora``'s peft format) of a LoRA run."""
CRITIC = "critic"
"""The critic worker's checkpoint manager's folder (gae)."""
STATE = "trainer_state.json"

#: safetensors' dtype names -> transformers' ``dtype`` in config.json (floating types only).
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def tensor_dtype(folder: Path) -> str | None:
    """The floating dtype of every tensor in ``folder``'s ``*.safetensors`` files, read from
    their headers (nothing loaded); None when there are none or they differ."""
    found: set[str] = set()
    for file in sorted(Path(folder).glob("*.safetensors")):
        with file.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, entry in header.items():
            if name != "__metadata__" and entry.get("dtype") in _SAFETENSORS_DTYPES:
                found.add(_SAFETENSORS_DTYPES[entry["dtype"]])
    return found.pop() if len(found) == 1 else None


def match_config_dtype(folder: Path) -> None:
    """Make ``folder/config.json`` say the dtype its weights are stored in."""
    config = Path(folder) / "config.json"
    dtype = tensor_dtype(folder)
    if dtype is None or not config.is_file():
        return
    data = json.loads(config.read_text())
    keys = [key for key in ("dtype", "torch_dtype") if key in data] or ["dtype"]
    if all(data.get(key) == dtype for key in keys):
        return
    data.update(dict.fromkeys(keys, dtype))
    atomic_write(config, json.dumps(data, indent=2, sort_keys=True) + "\n")


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
    if opt.lora is None:
        match_config_dtype(servable_weights(path))
    else:
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
