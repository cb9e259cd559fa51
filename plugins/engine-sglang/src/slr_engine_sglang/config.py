"""The ``sglang`` engine's options (the ``[engine]`` section when ``name = "sglang"``): the
shared ``ServerOptions`` and SGLang's own."""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators

from slr.config import option
from slr.engines.options import ServerOptions


@frozen(kw_only=True)
class SglangEngineConfig(ServerOptions):
    python: str = option(
        "python",
        doc="The Python that has SGLang installed; servers run `PYTHON -m sglang.launch_server`.",
    )
    extra_args: list[str] = option(
        factory=list, doc="More `launch_server` arguments, e.g. ['--tp-size', '2']."
    )
    experts_per_token: int = option(
        0,
        doc="Experts routed per token, to unpack SGLang's routing arrays; 0 reads "
        "num_experts_per_tok from the tokenizer folder's config.json.",
        validator=validators.ge(0),
    )
    weight_update: Literal["disk", "distributed", "tensor", "none"] = option(
        "disk",
        doc="How update_weights reaches the servers, in SGLang's own words: 'disk' writes the "
        "weights as a model folder under weights_dir and calls /update_weights_from_disk; "
        "'distributed' opens a process group with each server once "
        "(/init_weights_update_group, this process is rank 0) and broadcasts the weights "
        "bucket by bucket (/update_weights_from_distributed); 'tensor' hands each bucket over "
        "in shared memory (/update_weights_from_tensor; the servers must run on this "
        "machine); 'none' refuses updates.",
    )
    weight_bucket_bytes: int = option(
        512 * 1024 * 1024,
        doc="Most bytes of tensor data in one 'distributed' or 'tensor' update request (a "
        "larger tensor goes alone); at most two buckets are held at once, never the whole "
        "state dict.",
        validator=validators.gt(0),
    )
    weight_group_backend: Literal["nccl", "gloo"] = option(
        "nccl",
        doc="torch.distributed backend of the 'distributed' weight group: 'nccl' between GPUs "
        "(the trainer's tensors are sent from its current CUDA device), 'gloo' over TCP from "
        "the CPU.",
    )
    trainer_address: str = option(
        "",
        doc="Address the servers reach this process at for the 'distributed' weight group's "
        "rendezvous (empty: this host's name resolved; 127.0.0.1 for servers on this machine).",
    )
    weight_group_timeout_s: float = option(
        600.0,
        doc="How long joining the weight group, or one bucket's broadcast, may take before "
        "the update fails (a server that never joins would otherwise hang the trainer).",
        validator=validators.gt(0),
    )
    weights_dir: str = option(
        "",
        doc="Folder for weight updates and LoRA adapters, on a filesystem the servers read at "
        "the same path (empty: a temp folder, only right when the servers run on this machine).",
    )
    keep_weight_versions: int = option(
        2,
        doc="Weight folders kept under weights_dir (older ones are deleted once replaced).",
        validator=validators.ge(1),
    )
    max_lora_rank: int = option(
        0,
        doc="> 0: LoRA training ([optimizer] lora_rank up to this). Launched servers get "
        "--enable-lora --max-lora-rank N --lora-target-modules ... --max-loras-per-batch M; "
        "each LoRA update is written as an adapter folder under weights_dir, loaded with "
        "/load_lora_adapter under a fresh name per version (the previous one is then "
        "unloaded), and every later /generate names it (lora_path). 0: full weights only.",
        validator=validators.ge(0),
    )
    lora_target_modules: list[str] = option(
        factory=list,
        doc="--lora-target-modules: the module names adapters may cover (e.g. ['q_proj', "
        "'v_proj']); empty: 'all' (every module SGLang supports). A LoRA update over another "
        "module is refused before it is sent.",
    )
    max_loras_per_batch: int = option(
        2,
        doc="--max-loras-per-batch: adapters (the base counts as one) a running batch may mix; "
        "each slot reserves GPU memory. 2: the current adapter and the base.",
        validator=validators.ge(1),
    )
    allow_truncated_logprobs: bool = option(
        False,
        doc="Allow top_k / top_p. Their log-probs are not checked to be the trainer's "
        "definition (log_softmax(logits / T) over the full vocabulary); off by default.",
    )
