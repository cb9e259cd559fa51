"""``ServerOptions``: the ``[engine]`` options every HTTP-server engine has.

An engine plugin's config class subclasses it and adds its own (the command that
launches its server, how weights reach it, ...); the config reference lists these first.
"""

from __future__ import annotations

from attrs import frozen, validators

from slr.config import option


@frozen(kw_only=True)
class ServerOptions:
    model: str = option(
        "", doc="Model the servers load (a local folder or a hub id the GPU nodes can load)."
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
    host: str = option("127.0.0.1", doc="Address launched servers bind to.")
    base_port: int = option(
        0, doc="First port for launched servers (0: free ports).", validator=validators.ge(0)
    )
    served_model_name: str = option("slr-policy", doc="Name the servers serve the model as.")
    max_context: int = option(
        0,
        doc="Context length launched servers are started with (the server's context-length "
        "flag); 0 asks the server (/v1/models).",
        validator=validators.ge(0),
    )
    return_routed_experts: bool = option(
        False,
        doc="Launch with --enable-return-routed-experts and record MoE routing per token.",
    )
    startup_timeout_s: float = option(
        1800.0, doc="How long a launched server may take to become healthy."
    )
    request_timeout_s: float = option(
        900.0, doc="Longest a single generate call may take before the server counts as hung."
    )
    log_dir: str = option("", doc="Folder for launched servers' logs (empty: a temp folder).")
