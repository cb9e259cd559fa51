"""The vLLM engine's preflight: its servers answer and serve the model, or the launch has
what it needs (the ``vllm`` command, one GPU set per replica, GPUs with memory free); the
one sampling setting that makes its log-probs differ from the trainer's; and routed experts
in async training, which its partial weight updates cannot serve."""

from __future__ import annotations

import os
import shutil

import httpx

from slr.preflight import CheckResult, Context, fatal, ok, warn
from slr.preflight.engines import DOC, launch_headroom, model_cards, replica_gpus

REFUSED = "docs/troubleshooting/training.md#a-setting-is-refused-before-the-run-starts"


def _applies(ctx: Context) -> bool:
    return ctx.uses("engine", "vllm") and ctx.needs_engine()


def check_config(ctx: Context) -> list[CheckResult] | None:
    if not _applies(ctx):
        return None
    o = ctx.options("engine")
    found = [r for r in [replica_gpus(o)] if r is not None]
    if o.allow_truncated_logprobs and ctx.purpose == "run" and ctx.config.rollout.top_p < 1.0:
        found.append(
            warn(
                f"engine.allow_truncated_logprobs with rollout.top_p = "
                f"{ctx.config.rollout.top_p}: vLLM reports log-probs renormalized over the "
                f"nucleus, the trainer scores the full vocabulary, so their agreement drops",
                fix="keep rollout.top_p = 1.0 for training",
                doc="docs/troubleshooting/training.md#log-prob-agreement-falling",
            )
        )
    if o.return_routed_experts and ctx.purpose == "run" and ctx.config.run.mode == "async":
        found.append(
            fatal(
                "engine.return_routed_experts = true with run.mode = 'async': async training "
                "pushes weights mid-generation (a partial update), and vLLM returns routed "
                "experts only with the whole completion, so a generation has no token "
                "boundary to pause at and the first training step would fail after a whole "
                "rollout",
                fix="set run.mode = 'sync', or engine.return_routed_experts = false (and "
                "algorithm.routing_replay = false)",
                doc=REFUSED,
            )
        )
    return found or [ok(f"{len(o.urls) or o.replicas} vLLM server(s) configured")]


def check_servers(ctx: Context) -> list[CheckResult] | None:
    """Attached servers answer and serve ``served_model_name``; a launch finds its command
    and its GPUs."""
    if not _applies(ctx):
        return None
    o = ctx.options("engine")
    if not o.urls:
        results: list[CheckResult] = []
        exe = shutil.which(o.executable)
        if exe is None:
            results.append(
                fatal(
                    f"engine.executable = {o.executable!r} is not on PATH, so no vLLM server "
                    f"can be launched",
                    fix="pip install vllm on this machine, set engine.executable, or attach to "
                    "running servers with engine.urls",
                    doc=DOC,
                )
            )
        else:
            results.append(ok(f"vLLM command at {exe}"))
        results.append(cpu_headroom(o) if o.device == "cpu" else launch_headroom(o, label="vLLM"))
        return results
    results = []
    for url in o.urls:
        try:
            served = [str(card.get("id")) for card in model_cards(url)]
        except (httpx.HTTPError, ValueError) as exc:
            results.append(
                fatal(
                    f"the vLLM server at {url} does not answer /v1/models ({exc})",
                    fix="start it (`vllm serve MODEL --served-model-name "
                    f"{o.served_model_name}`), or fix engine.urls",
                    doc=DOC,
                )
            )
            continue
        if o.served_model_name not in served:
            results.append(
                fatal(
                    f"the vLLM server at {url} serves {served}, not engine.served_model_name "
                    f"= {o.served_model_name!r}",
                    fix="set engine.served_model_name to what it serves, or restart it with "
                    f"--served-model-name {o.served_model_name}",
                    doc=DOC,
                )
            )
            continue
        results.append(ok(f"the vLLM server at {url} serves {o.served_model_name!r}"))
    return results


KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
SERVER_OVERHEAD_GIB = 1.5  # one CPU server's model, workers and API process, besides its KV cache


def cpu_headroom(o) -> CheckResult:
    """vLLM's CPU build sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB); unset, it
    takes 92% of the machine's memory and refuses to start beside anything else."""
    import psutil

    space = o.env.get(KV_CACHE_ENV) or os.environ.get(KV_CACHE_ENV)
    if not space:
        return fatal(
            f"engine.device = 'cpu' but {KV_CACHE_ENV} is not set: vLLM's CPU build would "
            f"reserve 92% of this machine's memory and fail to start",
            fix=f'set engine.env = {{ {KV_CACHE_ENV} = "2" }} (GiB of KV cache per server)',
            doc=DOC,
        )
    try:
        gib = float(space)
    except ValueError:
        return fatal(f"{KV_CACHE_ENV} = {space!r} is not a number of GiB", fix='e.g. "2"')
    need = o.replicas * (gib + SERVER_OVERHEAD_GIB)
    free = psutil.virtual_memory().available / 2**30
    if free < need:
        return fatal(
            f"{o.replicas} CPU vLLM server(s) need ~{need:.1f} GiB ({KV_CACHE_ENV} = {gib:g} "
            f"GiB each + ~{SERVER_OVERHEAD_GIB} GiB), {free:.1f} GiB free",
            fix=f"lower {KV_CACHE_ENV} or engine.replicas, or free memory",
            doc=DOC,
        )
    return ok(f"{o.replicas} CPU vLLM server(s): ~{need:.1f} GiB of {free:.1f} GiB free")
