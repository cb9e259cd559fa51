"""One end of an SGLang weight-update process group: join it, broadcast into it, leave it.

SGLang's ``/init_weights_update_group`` makes each of a server's tensor-parallel workers
join a torch.distributed group that is *not* the server's own world: a TCP rendezvous at
``tcp://master_address:master_port`` (rank 0, the process that holds the weights, hosts
the store), a store prefixed with the group's name, and a process group built over it
(SGLang's ``init_custom_process_group``, in ``python/sglang/srt/utils``; the worker side
in ``python/sglang/srt/model_executor/weight_updater.py``). The two ends only meet if
they build the group the same way, so both ends here (the engine as rank 0, and the test
stand-in as the server's workers) call ``join_group``, which takes SGLang's steps.

``/update_weights_from_distributed`` then names each tensor (``names``, ``dtypes``,
``shapes``); the workers allocate them and receive one ``broadcast`` per tensor from rank
0, in that order (``send_bucket`` / ``receive_bucket``).

torch's group constructor is private API (``_new_process_group_helper``), as it is in
SGLang: a torch upgrade that moves it shows up in ``plugins/engine-sglang/tests``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

DEFAULT_GROUP_NAME = "weight_update_group"


def join_group(
    *,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
) -> Any:
    """Join weight group ``group_name`` as ``rank`` (0: the trainer, which hosts the store);
    blocks until every rank has joined or ``timeout_s`` passes."""
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.rendezvous import rendezvous

    timeout = timedelta(seconds=timeout_s)
    url = f"tcp://{_host(master_address)}:{master_port}"
    store, _, _ = next(rendezvous(url, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    group, _ = c10d._new_process_group_helper(
        world_size, rank, [], backend, store, group_name=c10d.GroupName(group_name), timeout=timeout
    )
    # broadcast(src=...) reads global ranks through this table; the group is its own world
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def leave_group(group: Any) -> None:
    """Leave a group ``join_group`` made (the other ends leave theirs on their own)."""
    import torch.distributed as dist

    dist.destroy_process_group(group)


def device_for(backend: str) -> str:
    """Where tensors must be for ``backend``'s collectives."""
    return "cuda" if backend == "nccl" else "cpu"


def send_bucket(group: Any, tensors: Sequence[Any], *, backend: str) -> None:
    """Broadcast ``tensors`` from rank 0, in order (what the workers were told to expect)."""
    import torch.distributed as dist

    device = device_for(backend)
    # each tensor stays referenced until its broadcast is done
    sent = [t.detach().to(device).contiguous() for t in tensors]
    _wait([dist.broadcast(t, src=0, group=group, async_op=True) for t in sent])


def receive_bucket(
    group: Any, dtypes: Sequence[str], shapes: Sequence[Sequence[int]], *, device: str = "cpu"
) -> list[Any]:
    """The receiving side of ``send_bucket``: one tensor per (dtype name, shape)."""
    import torch
    import torch.distributed as dist

    out = [
        torch.empty([int(n) for n in shape], dtype=dtype_of(name), device=device)
        for name, shape in zip(dtypes, shapes, strict=True)
    ]
    _wait([dist.broadcast(t, src=0, group=group, async_op=True) for t in out])
    return out


def _wait(handles: Sequence[Any]) -> None:
    for handle in handles:
        if handle is not None:  # None only from ranks outside the group
            handle.wait()


def dtype_name(tensor: Any) -> str:
    """A tensor's dtype as SGLang reads it back (``getattr(torch, name)``): ``"bfloat16"``."""
    return str(tensor.dtype).removeprefix("torch.")


def dtype_of(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name (e.g. 'bfloat16', 'float32')")
    return dtype


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
