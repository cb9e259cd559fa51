"""The ``hf`` engine's preflight: its model resolves offline, its tokenizer loads, and the
tokenizer passes the core's model checks (``slr.preflight.model``). No weights are loaded."""

from __future__ import annotations

import json
from pathlib import Path

from slr.errors import SlrError
from slr.preflight import CheckResult, Context, fatal, ok
from slr.preflight.model import chat_template_round_trip, context_length, tool_call_round_trip


def _tokenizer_folder(model: str) -> Path:
    from slr_engine_hf.models import PACKAGED, ensure_tokenizer, resolve

    path = Path(model).expanduser()
    if model in PACKAGED or path.suffix == ".gguf":
        return ensure_tokenizer(model)
    return resolve(model)  # a model folder: checked, not converted


def _model_context(folder: Path) -> int | None:
    from slr.engines.lora import CONFIG, is_adapter_folder

    if is_adapter_folder(folder):  # a LoRA checkpoint: the context is its base model's
        from slr_engine_hf.models import resolve

        base = json.loads((folder / CONFIG).read_text()).get("base_model_name_or_path")
        try:
            folder = resolve(base) if base else folder
        except SlrError:
            return None
    config = folder / "config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text()).get("max_position_embeddings")
    return int(value) if value else None


def check_model(ctx: Context) -> list[CheckResult] | None:
    if not ctx.uses("engine", "hf") or not ctx.needs_engine():
        return None
    options = ctx.options("engine")
    model = options.model
    folder = model  # what the error names when the folder itself cannot be found
    try:
        folder = _tokenizer_folder(model)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except SlrError as exc:
        return [fatal(str(exc), fix="set engine.model to a model that is on this machine")]
    except (OSError, ValueError) as exc:
        return [
            fatal(
                f"engine.model = {model!r}: the tokenizer in {folder} does not load ({exc})",
                fix="point engine.model at a complete Hugging Face model folder",
            )
        ]
    results = [ok(f"engine.model = {model!r}: tokenizer loads from {folder}")]
    template = chat_template_round_trip(tokenizer)
    results.append(template)
    if template.status != "fatal":
        protocol = ctx.agent_attribute("protocol", "openai")
        results.append(tool_call_round_trip(tokenizer, ctx.config.proxy.tool_parser, protocol))
    limit = _model_context(folder)
    context = options.max_context or limit
    if limit and options.max_context > limit:
        results.append(
            fatal(
                f"engine.max_context = {options.max_context} exceeds the model's own limit {limit}",
                fix=f"set engine.max_context to at most {limit} (or 0: the model's own)",
            )
        )
    results.append(context_length(ctx, context))
    return results


def check_device(ctx: Context) -> CheckResult | None:
    """A CUDA device must be here, with memory free (fatal on a CPU-only machine)."""
    if not ctx.uses("engine", "hf") or not ctx.needs_engine():
        return None
    device = ctx.options("engine").device
    if not device.startswith("cuda") or ctx.config.run.engine_replicas >= 1:
        return None  # replicas are Ray actors: the gpu / ray-topology checks place them
    from slr.preflight.gpus import gpu_headroom

    return gpu_headroom(
        f"engine.device = {device!r}", 1, fix='set engine.device = "cpu" (the default)'
    )
