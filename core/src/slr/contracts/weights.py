"""What travels from the optimizer to the engines: a weight update, whole or a LoRA adapter.

``Optimizer.export_weights`` returns a mapping of parameter names to tensors and
``Engine.update_weights`` takes one. A plain mapping is the whole policy (a state dict). A
``WeightUpdate`` is also a mapping (so every engine and transport that passes state dicts
along passes it unchanged), and says what its tensors are: ``kind = "full"`` (a state dict)
or ``kind = "lora"`` (only a LoRA adapter's A / B matrices, ``LoraSpec`` saying how to apply
them over the engine's own base weights). An engine that cannot apply an adapter must say
so (``require_full``) instead of mistaking adapter tensors for parameter names.

Adapter tensor names are the adapted module's name in the base model plus ``.lora_A.weight``
or ``.lora_B.weight`` (``model.layers.0.self_attn.q_proj.lora_A.weight``): no adapter name,
no wrapper prefix. ``slr.engines.lora`` writes them as a peft adapter folder.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol, TypeGuard, runtime_checkable

from attrs import field, frozen, validators

WeightKind = Literal["full", "lora"]
LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


@frozen(kw_only=True)
class LoraSpec:
    """How a LoRA adapter applies: ``W x + (alpha / rank) * B (A x)`` on each named module."""

    rank: int = field(validator=validators.gt(0))
    alpha: float = field(converter=float)
    modules: tuple[str, ...] = field(converter=tuple)
    """The adapted modules' names in the base model (resolved: no patterns)."""
    base_model: str = ""
    """The base model the adapter was trained on (a folder or a name engines resolve)."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _tensor_bytes(value: Any) -> int:
    """Bytes of one tensor's data (torch: numel x element_size; numpy: nbytes; else 0)."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    try:
        return int(value.numel()) * int(value.element_size())
    except AttributeError:
        return 0


@frozen(kw_only=True, eq=False)
class WeightUpdate(Mapping[str, Any]):
    """One weight update: its tensors by name, and what they are (module docstring)."""

    tensors: Mapping[str, Any]
    kind: WeightKind = "full"
    lora: LoraSpec | None = None

    def __attrs_post_init__(self) -> None:
        if (self.kind == "lora") != (self.lora is not None):
            raise ValueError(
                f"a {self.kind!r} weight update {'needs' if self.kind == 'lora' else 'takes no'} a LoraSpec"
            )
        if self.kind == "lora":
            odd = [k for k in self.tensors if not k.endswith(LORA_SUFFIXES)]
            if odd:
                raise ValueError(
                    f"a LoRA update holds only adapter matrices (*.lora_A.weight, "
                    f"*.lora_B.weight); got {odd[:3]}"
                )

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data this update carries (what a transfer moves)."""
        return payload_bytes(self.tensors)


@runtime_checkable
class LiveExport(Protocol):
    """An export whose tensors are read from the trainer's parameters when they are read
    (verl's gathered state dict), not copied when it was made. Read again after the next
    optimizer step it gives that step's weights, so it cannot be sent again as the version
    it was published as (``replayable``)."""

    def reads_live_parameters(self) -> bool: ...


def replayable(weights: object) -> bool:
    """Whether ``weights`` (what a balancer kept of the latest update) can be sent again,
    later, as the same version: a state dict of copied tensors, a ``WeightUpdate``, or a
    reference to an immutable copy (Ray's object store) can; a ``LiveExport`` cannot."""
    return not (isinstance(weights, LiveExport) and weights.reads_live_parameters())


def payload_bytes(weights: Mapping[str, Any]) -> int:
    """Bytes of tensor data in a state dict or ``WeightUpdate``."""
    return sum(_tensor_bytes(v) for v in weights.values())


def buckets(weights: Mapping[str, Any], max_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """``weights``' tensors in order, as lists of ``(name, tensor)`` of at most ``max_bytes``
    of tensor data (a larger tensor is a bucket of its own). A tensor is read from the
    mapping only when its bucket is being filled, so a mapping that gathers each tensor when
    read (verl's optimizer exports one) is never held whole: transfers that send bucket by
    bucket keep one bucket (plus the one being sent) in memory."""
    if max_bytes <= 0:
        raise ValueError(f"a weight bucket holds at least one byte; got max_bytes={max_bytes}")
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name in weights:
        tensor = weights[name]
        nbytes = _tensor_bytes(tensor)
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def is_lora(weights: Any) -> TypeGuard[WeightUpdate]:
    """Whether ``weights`` (what ``export_weights`` returned) is a LoRA adapter update."""
    return isinstance(weights, WeightUpdate) and weights.kind == "lora"


def portable(weights: Mapping[str, Any]) -> Mapping[str, Any]:
    """``weights`` as a picklable value that keeps its kind: a ``WeightUpdate`` as it is, any
    other mapping as a plain dict (for Ray's object store and other process boundaries)."""
    return weights if isinstance(weights, WeightUpdate) else dict(weights)


def require_full(weights: Mapping[str, Any], *, engine: str) -> Mapping[str, Any]:
    """The state dict to apply, or a clear error when ``weights`` is a LoRA adapter that the
    engine ``engine`` cannot apply."""
    if is_lora(weights):
        raise NotImplementedError(
            f"the {engine} engine cannot apply a LoRA adapter update; train full weights "
            f"([optimizer] lora_rank = 0) or use an engine that loads adapters (hf, vllm, sglang)"
        )
    return weights


def sync_metrics(weights: Any) -> dict[str, float]:
    """A step's weight-sync metrics: ``sync/bytes`` (tensor data sent to each engine) and
    ``sync/lora`` (1 for an adapter-only update). None for weights held elsewhere (a Ray
    object reference): their size is not known here."""
    if not isinstance(weights, Mapping):
        return {}
    return {"sync/bytes": float(payload_bytes(weights)), "sync/lora": float(is_lora(weights))}
