"""The LoRA adapter folder: peft's on-disk format, read and written in one place.

::

    adapter_config.json          peft's LoraConfig (peft_type LORA, r, lora_alpha,
                                 target_modules, base_model_name_or_path, ...)
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight / .lora_B.weight

The torch optimizer writes its checkpoints' servable weights so (``policy/``), the hf engine
serves such a folder over its base model, and the vLLM engine hands one to the server's
``/v1/load_lora_adapter``; peft's ``PeftModel.from_pretrained`` and vLLM read it as their own.
The tensors in memory are a ``slr.contracts.weights.WeightUpdate`` of kind ``"lora"``.

torch and safetensors are imported when a folder is read or written: the callers (engine and
optimizer plugins) bring them; the core does not depend on them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slr.contracts.weights import LORA_SUFFIXES, LoraSpec, WeightUpdate
from slr.errors import UsageError

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
"""peft's prefix on every key of a saved adapter (its wrapper's attribute path)."""


def is_adapter_folder(path: str | Path) -> bool:
    """Whether ``path`` is a LoRA adapter folder (rather than a whole model)."""
    folder = Path(path)
    return (folder / CONFIG).is_file() and not (folder / "config.json").is_file()


def adapter_config(spec: LoraSpec) -> dict[str, Any]:
    """peft's ``adapter_config.json`` for ``spec`` (inference: no dropout)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": spec.base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(spec.modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "modules_to_save": None,
    }


def write_adapter(folder: str | Path, update: WeightUpdate) -> Path:
    """Write a ``"lora"`` update as a peft adapter folder; returns the folder."""
    from safetensors.torch import save_file

    if update.lora is None:
        raise ValueError("write_adapter needs a LoRA update (kind = 'lora')")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {PREFIX + k: v.detach().to("cpu").contiguous() for k, v in update.items()}
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    (folder / CONFIG).write_text(json.dumps(adapter_config(update.lora), indent=2) + "\n")
    return folder


def read_adapter(folder: str | Path, *, device: str = "cpu") -> WeightUpdate:
    """A peft adapter folder as a ``"lora"`` ``WeightUpdate`` (its modules from its keys)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        config = json.loads((folder / CONFIG).read_text())
        raw = load_file(str(folder / WEIGHTS), device=device)
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{str(folder)!r} is not a readable LoRA adapter folder ({CONFIG} + {WEIGHTS}): {exc}"
        ) from exc
    if config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise UsageError(
            f"{str(folder)!r} holds a {config.get('peft_type')} adapter"
            f"{' with DoRA' if config.get('use_dora') else ''}; only plain LoRA is served"
        )
    tensors = {k.removeprefix(PREFIX): v for k, v in raw.items()}
    modules = sorted({k[: -len(s)] for k in tensors for s in LORA_SUFFIXES if k.endswith(s)})
    spec = LoraSpec(
        rank=int(config["r"]),
        alpha=float(config.get("lora_alpha", config["r"])),
        modules=tuple(modules),
        base_model=str(config.get("base_model_name_or_path") or ""),
    )
    return WeightUpdate(tensors=tensors, kind="lora", lora=spec)


# -- adapters on a model in memory (peft's LoRA layers) ---------------------------------------

ADAPTER = "default"
"""The adapter's name inside the model's peft layers (``lora_A.default``)."""


def adapted_modules(model: Any) -> tuple[str, ...]:
    """The names of ``model``'s modules that carry a LoRA adapter (none: not adapted)."""
    return tuple(n for n, m in model.named_modules() if ADAPTER in getattr(m, "lora_A", {}))


def inject(
    model: Any, *, rank: int, alpha: float, target_modules: str | list[str], dropout: float = 0.0
) -> tuple[str, ...]:
    """Put a fresh LoRA adapter on ``model``'s ``target_modules`` in place (peft's layers:
    the model keeps its class, its base weights are frozen); returns the adapted modules.

    ``target_modules``: peft's spelling (``"all-linear"``, module name suffixes such as
    ``["q_proj", "v_proj"]``, or a regular expression string). Nothing matched raises a
    ``ConfigError`` naming the model's linear layers.
    """
    from peft import LoraConfig, inject_adapter_in_model

    from slr.errors import ConfigError

    config = LoraConfig(
        r=rank,
        # peft annotates an int; it only ever divides it by r, and a float alpha is fine
        lora_alpha=alpha,  # pyright: ignore[reportArgumentType]
        lora_dropout=dropout,
        target_modules=target_modules,
        bias="none",
    )
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as exc:  # peft's NoMatchingPeftModuleError is one
        raise ConfigError(
            f"target_modules = {target_modules!r} matches no module of "
            f"{type(model).__name__} ({exc}); its linear layers are named "
            f"{', '.join(linear_names(model)) or '(none)'}, or write 'all-linear'"
        ) from None
    return adapted_modules(model)


def linear_names(model: Any) -> list[str]:
    """The distinct last names of ``model``'s linear layers (what target_modules matches)."""
    import torch

    return sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    )


def _param_name(key: str) -> str:
    """``x.lora_A.weight`` (an update's key) as the model's parameter ``x.lora_A.default.weight``."""
    head, kind, _ = key.rpartition(".lora_")
    return f"{head}.lora_{kind[0]}.{ADAPTER}.weight"


def adapter_tensors(model: Any) -> dict[str, Any]:
    """The adapter's matrices on ``model``, by update key (parameters, not copies)."""
    out = {}
    for module in adapted_modules(model):
        sub = model.get_submodule(module)
        out[f"{module}.lora_A.weight"] = sub.lora_A[ADAPTER].weight
        out[f"{module}.lora_B.weight"] = sub.lora_B[ADAPTER].weight
    return out


def load_weights(model: Any, update: WeightUpdate) -> None:
    """Copy a ``"lora"`` update into ``model``, putting the adapter on first (inference: no
    dropout). Every name and shape is checked before anything is copied; an adapter over
    other modules or of another rank than the one already on the model is refused."""
    import torch

    spec = update.lora
    if spec is None:
        raise ValueError("load_weights needs a LoRA update (kind = 'lora')")
    have = adapted_modules(model)
    if not have:
        have = inject(model, rank=spec.rank, alpha=spec.alpha, target_modules=list(spec.modules))
    if set(have) != set(spec.modules):
        raise ValueError(
            f"this LoRA update adapts {len(spec.modules)} modules, the model's adapter "
            f"{len(have)} (e.g. {sorted(set(spec.modules) ^ set(have))[:3]} differ): an "
            f"adapter over other modules needs a fresh engine"
        )
    targets = adapter_tensors(model)
    missing = sorted(set(targets) - set(update))
    unknown = sorted(set(update) - set(targets))
    if missing or unknown:
        raise ValueError(
            f"LoRA update does not fit the model's adapter: missing {missing[:3]}, "
            f"unknown {unknown[:3]}"
        )
    for key, value in update.items():
        if tuple(value.shape) != tuple(targets[key].shape):
            raise ValueError(
                f"LoRA update: {key} has shape {tuple(value.shape)}, the model's adapter "
                f"{tuple(targets[key].shape)} (rank {spec.rank} vs the adapter's)"
            )
    with torch.no_grad():
        for key, value in update.items():
            target = targets[key]
            target.copy_(value.to(device=target.device, dtype=target.dtype))
    for module in have:  # the scale the update was trained with
        sub = model.get_submodule(module)
        sub.scaling[ADAPTER] = spec.scaling
