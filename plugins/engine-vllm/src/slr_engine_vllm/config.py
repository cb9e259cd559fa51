"""The ``vllm`` engine's options (the ``[engine]`` section when ``name = "vllm"``)."""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators

from slr.config import option


@frozen(kw_only=True)
class VllmEngineConfig:
    model: str = option(
        "", doc="Model for `vllm serve` (a local folder or a hub id the GPU nodes can load)."
    )
    tokenizer: str = option(
        "", doc="Local tokenizer folder for prompts; empty means the same as `model`."
    )
    urls: list[str] = option(
        factory=list,
        doc="Attach to these running servers (http://host:port) instead of launching any.",
    )
    replicas: int = option(
        1, doc="Servers to launch when `urls` is empty.", validator=validators.ge(1)
    )
    gpus_per_replica: list[str] = option(
        factory=list,
        doc="CUDA_VISIBLE_DEVICES for each launched server, e.g. ['0', '1'] or ['0,1', '2,3'].",
    )
    executable: str = option("vllm", doc="The vLLM command to launch (found on PATH).")
    host: str = option("127.0.0.1", doc="Address launched servers bind to.")
    base_port: int = option(
        0, doc="First port for launched servers (0: free ports).", validator=validators.ge(0)
    )
    served_model_name: str = option("slr-policy", doc="Name the servers serve the model as.")
    max_context: int = option(
        0,
        doc="--max-model-len for launched servers; 0 asks the server.",
        validator=validators.ge(0),
    )
    extra_args: list[str] = option(
        factory=list, doc="More `vllm serve` arguments, e.g. ['--tensor-parallel-size', '2']."
    )
    return_routed_experts: bool = option(
        False, doc="Launch with --enable-return-routed-experts and record MoE routing."
    )
    weight_transfer: Literal["nccl", "none"] = option(
        "nccl",
        doc="How update_weights reaches the servers: vLLM's NCCL weight-transfer API "
        "(the trainer joins an NCCL group with the servers), or 'none' (updates refused).",
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
    startup_timeout_s: float = option(
        1800.0, doc="How long a launched server may take to become healthy."
    )
    request_timeout_s: float = option(
        900.0, doc="Longest a single generate call may take before the server counts as hung."
    )
    log_dir: str = option("", doc="Folder for launched servers' logs (empty: a temp folder).")
