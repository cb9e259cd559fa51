"""Weight updates through SGLang's ``/update_weights_from_disk``, and LoRA adapter folders.

The trainer's state dict is written as a model folder (``model.safetensors`` beside the
model's ``config.json`` and tokenizer files, which SGLang's loader reads too) under
``[engine] weights_dir``, one folder per version; the server is then asked to load it
with ``{"model_path": folder, "weight_version": "<version>"}``. The folder must be
readable by the server at the same path: the same machine, or a shared filesystem.
Older folders beyond ``keep_weight_versions`` are deleted once a newer one is loaded.

A LoRA update (``slr.contracts.weights.WeightUpdate`` of kind ``"lora"``) gets the same
versioned folder, written as a peft adapter folder by ``slr.engines.lora`` (the format's owner),
for ``/load_lora_adapter`` to read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slr.contracts.weights import is_lora
from slr.engines.lora import write_adapter

# Files of a model folder that SGLang reads besides the weights themselves.
_BESIDE_WEIGHTS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
WEIGHTS_FILE = "model.safetensors"


class WeightFolders:
    """Writes each version's weights as a loadable model folder; keeps the newest few.

    One instance serves every replica of a run: an update's weights are written once
    (the first replica to ask writes them, the others get the same folder). Each process
    writes under its own subfolder, so a version number reused by a resumed run never
    names another run's weights.
    """

    def __init__(self, root: str, *, source: str, keep: int = 2) -> None:
        base = Path(root) if root else Path(tempfile.gettempdir()) / "slr-sglang-weights"
        self.root = base / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.source = Path(source) if source and Path(source).is_dir() else None
        self.keep = keep
        self._lock = threading.Lock()
        self._written: tuple[int, int] | None = None  # (version, id of its state dict)

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def write(self, state_dict: Mapping[str, Any], version: int) -> Path:
        """Write ``state_dict`` as version ``version``'s folder (complete before it is named):
        a model folder, or a peft adapter folder for a LoRA update."""
        with self._lock:
            final = self.folder(version)
            if self._written == (version, id(state_dict)) and final.is_dir():
                return final
            self._write(state_dict, final)
            self._written = (version, id(state_dict))
            return final

    def _write(self, state_dict: Mapping[str, Any], final: Path) -> None:
        from safetensors.torch import save_file

        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        if is_lora(state_dict):
            write_adapter(partial, state_dict)
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            return
        partial.mkdir(parents=True)
        if self.source is not None:
            for name in _BESIDE_WEIGHTS:
                if (self.source / name).is_file():
                    shutil.copy2(self.source / name, partial / name)
        # safetensors refuses tensors that share memory (tied embeddings): one copy each
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
        save_file(tensors, str(partial / WEIGHTS_FILE), metadata={"format": "pt"})
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)

    def prune(self, current: int) -> None:
        """Delete the folders older than the newest ``keep`` up to ``current``."""
        with self._lock:
            done = sorted(
                p
                for p in self.root.glob("v[0-9]*")
                if p.is_dir() and not p.name.endswith(".partial")
            )
            older = [p for p in done if p.name <= self.folder(current).name][: -self.keep]
            for p in older:
                shutil.rmtree(p, ignore_errors=True)
