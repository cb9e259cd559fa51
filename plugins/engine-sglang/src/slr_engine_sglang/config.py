"""The ``sglang`` engine's options (the ``[engine]`` section when ``name = "sglang"``)."""

from __future__ import annotations

from typing import Literal

from attrs import frozen, validators

from slr.config import option


@frozen(kw_only=True)
class SglangEngineConfig:
    model: str = option(
        "",
        doc="Model for `sglang.launch_server --model-path` (a local folder or a hub id the GPU "
        "nodes can load).",
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
    python: str = option(
        "python",
        doc="The Python that has SGLang installed; servers run `PYTHON -m sglang.launch_server`.",
    )
    host: str = option("127.0.0.1", doc="Address launched servers bind to.")
    base_port: int = option(
        0, doc="First port for launched servers (0: free ports).", validator=validators.ge(0)
    )
    served_model_name: str = option("slr-policy", doc="Name the servers serve the model as.")
    max_context: int = option(
        0,
        doc="--context-length for launched servers; 0 asks the server (/v1/models).",
        validator=validators.ge(0),
    )
    extra_args: list[str] = option(
        factory=list, doc="More `launch_server` arguments, e.g. ['--tp-size', '2']."
    )
    return_routed_experts: bool = option(
        False,
        doc="Launch with --enable-return-routed-experts and record MoE routing per token.",
    )
    experts_per_token: int = option(
        0,
        doc="Experts routed per token, to unpack SGLang's routing arrays; 0 reads "
        "num_experts_per_tok from the tokenizer folder's config.json.",
        validator=validators.ge(0),
    )
    weight_update: Literal["disk", "none"] = option(
        "disk",
        doc="How update_weights reaches the servers: 'disk' writes the weights as a model "
        "folder under weights_dir and calls /update_weights_from_disk; 'none' refuses updates.",
    )
    weights_dir: str = option(
        "",
        doc="Folder for weight updates, on a filesystem the servers read at the same path "
        "(empty: a temp folder, only right when the servers run on this machine).",
    )
    keep_weight_versions: int = option(
        2,
        doc="Weight folders kept under weights_dir (older ones are deleted once replaced).",
        validator=validators.ge(1),
    )
    allow_truncated_logprobs: bool = option(
        False,
        doc="Allow top_k / top_p. Their log-probs are not checked to be the trainer's "
        "definition (log_softmax(logits / T) over the full vocabulary); off by default.",
    )
    startup_timeout_s: float = option(
        1800.0, doc="How long a launched server may take to become healthy."
    )
    request_timeout_s: float = option(
        900.0, doc="Longest a single generate call may take before the server counts as hung."
    )
    log_dir: str = option("", doc="Folder for launched servers' logs (empty: a temp folder).")
