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
