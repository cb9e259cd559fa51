"""The SGLang engine's preflight: its servers answer, or the launch has what it needs (a
Python with SGLang, one GPU set per replica, GPUs with memory free); and where weight
updates are written (or how they travel) when the servers are elsewhere; and that the
servers take the LoRA adapter the optimizer trains."""

from __future__ import annotations

import shutil
import subprocess
from urllib.parse import urlparse

import httpx

from slr.preflight import CheckResult, Context, fatal, ok, warn
from slr.preflight.engines import DOC, launch_headroom, model_cards, replica_gpus

_LOCAL = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


def _applies(ctx: Context) -> bool:
    return ctx.uses("engine", "sglang") and ctx.needs_engine()


def check_config(ctx: Context) -> list[CheckResult] | None:
    if not _applies(ctx):
        return None
    o = ctx.options("engine")
    found = [r for r in [replica_gpus(o)] if r is not None]
    remote = [u for u in o.urls if urlparse(u).hostname not in _LOCAL]
    if remote and o.weight_update == "disk" and not o.weights_dir and ctx.purpose == "run":
        found.append(
            warn(
                f"engine.weights_dir is empty but servers run elsewhere ({', '.join(remote)}): "
                f"weight updates are written to a temp folder on this machine, which they "
                f"cannot read",
                fix="set engine.weights_dir to a folder on a filesystem the servers share, "
                "at the same path",
            )
        )
    if remote and o.weight_update == "tensor":
        found.append(
            fatal(
                f"engine.weight_update = 'tensor' hands tensors over in this machine's shared "
                f"memory, but servers run elsewhere ({', '.join(remote)})",
                fix="use weight_update = 'distributed' (a process group over the network) or "
                "'disk' (a shared filesystem) for servers on other machines",
            )
        )
    if remote and o.weight_update == "distributed" and not o.trainer_address:
        found.append(
            warn(
                f"engine.trainer_address is empty and servers run elsewhere "
                f"({', '.join(remote)}): they will be told to reach this machine at its host "
                f"name's address",
                fix="set engine.trainer_address to the address the servers reach this machine at",
            )
        )
    lora_rank = _trained_lora_rank(ctx)
    if lora_rank > o.max_lora_rank and ctx.purpose == "run":
        found.append(
            fatal(
                f"the optimizer trains a rank-{lora_rank} LoRA adapter but engine.max_lora_rank "
                f"is {o.max_lora_rank}: the SGLang servers would refuse it at the first update",
                fix=f"set engine.max_lora_rank to at least {lora_rank} (launched servers get "
                f"--enable-lora --max-lora-rank; attached ones must have been started so)",
            )
        )
    return found or [ok(f"{len(o.urls) or o.replicas} SGLang server(s) configured")]


def _trained_lora_rank(ctx: Context) -> int:
    """The optimizer's ``lora_rank`` (0: full weights, or an optimizer without one)."""
    try:
        return int(getattr(ctx.options("optimizer"), "lora_rank", 0) or 0)
    except (AttributeError, TypeError, ValueError):
        return 0


def _has_sglang(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import sglang"], capture_output=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def check_servers(ctx: Context) -> list[CheckResult] | None:
    """Attached servers answer ``/v1/models``; a launch finds SGLang and its GPUs."""
    if not _applies(ctx):
        return None
    o = ctx.options("engine")
    if not o.urls:
        results: list[CheckResult] = []
        python = shutil.which(o.python)
        if python is None or not _has_sglang(python):
            results.append(
                fatal(
                    f"engine.python = {o.python!r} "
                    + ("is not on PATH" if python is None else "cannot import sglang")
                    + ", so no SGLang server can be launched",
                    fix="pip install sglang for that interpreter, set engine.python to one that "
                    "has it, or attach to running servers with engine.urls",
                    doc=DOC,
                )
            )
        else:
            results.append(ok(f"SGLang importable by {python}"))
        results.append(launch_headroom(o, label="SGLang"))
        return results
    results = []
    for url in o.urls:
        try:
            cards = model_cards(url)
        except (httpx.HTTPError, ValueError) as exc:
            results.append(
                fatal(
                    f"the SGLang server at {url} does not answer /v1/models ({exc})",
                    fix="start it (`python -m sglang.launch_server --model-path MODEL`), or fix "
                    "engine.urls",
                    doc=DOC,
                )
            )
            continue
        if not any(card.get("max_model_len") for card in cards) and not o.max_context:
            results.append(
                fatal(
                    f"the SGLang server at {url} reports no max_model_len",
                    fix="set engine.max_context to the server's --context-length",
                    doc=DOC,
                )
            )
            continue
        results.append(ok(f"the SGLang server at {url} answers"))
    return results
