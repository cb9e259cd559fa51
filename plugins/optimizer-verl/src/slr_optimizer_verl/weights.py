"""The policy's weights read out of an FSDP module: one parameter gathered at a time.

A rank holds only its shards (DTensors under FSDP2); ``gather`` assembles the named
parameters whole (``full_tensor``, a collective every rank of the group joins) and copies
them to the CPU. ``plan_buckets`` groups names into buckets of at most ``max_bytes`` from
their sizes alone, so the caller (this process, or the driver of a Ray worker group) asks
for one bucket at a time and nothing ever holds the whole state dict. The in-process group
(``worker.WorkerGroup``) and each rank of the Ray group (``ray_group.RankWorker``) use the
same functions, so both export the same buckets in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

Named = list[tuple[str, torch.Tensor]]


def sizes(module: Any) -> list[tuple[str, int]]:
    """``(name, bytes of the whole tensor)`` for each entry of ``module``'s state dict, in
    its order; read from shapes and dtypes, nothing gathered."""
    out = []
    for name, tensor in module.state_dict().items():
        out.append((name, int(tensor.numel()) * tensor.element_size()))
    return out


def gather(module: Any, names: Sequence[str]) -> Named:
    """``names`` of ``module``'s state dict, each gathered whole from its shards, on the CPU.

    Under FSDP every rank must call this with the same names (each gather is a collective)."""
    state = module.state_dict()
    out = []
    for name in names:
        tensor = state[name]
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        out.append((name, full.detach().to("cpu", copy=True)))
    return out


def plan_buckets(named_sizes: Sequence[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Names grouped in order into buckets of at most ``max_bytes`` (a larger tensor is a
    bucket of its own)."""
    buckets: list[list[str]] = []
    bucket: list[str] = []
    size = 0
    for name, nbytes in named_sizes:
        if bucket and size + nbytes > max_bytes:
            buckets.append(bucket)
            bucket, size = [], 0
        bucket.append(name)
        size += nbytes
    if bucket:
        buckets.append(bucket)
    return buckets


class GatheredWeights(Mapping[str, torch.Tensor]):
    """A state dict read lazily: ``[name]`` gathers that one tensor (``fetch([name])``)."""

    def __init__(self, names: Sequence[str], fetch: Callable[[list[str]], Named]) -> None:
        self._names = list(names)
        self._known = set(self._names)
        self._fetch = fetch

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._known:
            raise KeyError(name)
        return self._fetch([name])[0][1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def reads_live_parameters(self) -> bool:
        """Always: a tensor is gathered from the model when read, so this mapping read after
        the next step gives that step's weights (``slr.contracts.weights.LiveExport``)."""
        return True
