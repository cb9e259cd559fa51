"""How one weight update reaches one SGLang server: the three routes SGLang serves.

``[engine] weight_update`` picks one (SGLang's own words for them):

- ``disk``: the weights as a model folder (``weights.WeightFolders``, written once for
  every replica), then ``/update_weights_from_disk``. Needs a filesystem both sides read.
- ``distributed``: once per server, ``/init_weights_update_group`` while this process
  joins the same group as rank 0 (``group.join_group``); then per update, bucket by bucket
  (``[engine] weight_bucket_bytes``), ``/update_weights_from_distributed`` names the
  bucket's tensors while this process broadcasts them. No file, no full state dict: a
  lazily gathered mapping (verl's export) is read one bucket ahead.
- ``tensor``: per bucket, ``/update_weights_from_tensor`` with the tensors in shared
  memory (``tensors.serialize``): the server must run on this machine.

Only an update's last bucket names the new ``weight_version`` and flushes the server's
prefix cache. The engine calls ``push`` inside its swap (no request of ours runs) and
``close`` when it closes (the group is left on both sides).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import httpx
import structlog
from attrs import frozen

from slr.contracts import EngineUnavailable
from slr.contracts.weights import buckets
from slr.engines.protocol import response_json
from slr.engines.server import free_port
from slr_engine_sglang import group as groups
from slr_engine_sglang import tensors
from slr_engine_sglang.config import SglangEngineConfig
from slr_engine_sglang.protocol import (
    ProtocolError,
    destroy_group_request,
    distributed_request,
    init_group_request,
    server_ranks,
    tensor_request,
)
from slr_engine_sglang.weights import WeightFolders

log = structlog.get_logger()
T = TypeVar("T")


@frozen
class Server:
    """Where an update's requests go: the server's URL and a client for the running loop."""

    url: str
    client: httpx.AsyncClient


class WeightTransfer(Protocol):
    async def push(self, server: Server, weights: Mapping[str, Any], version: int) -> None:
        """Put ``weights`` (all of the policy's, or part of them) into the server, as
        ``version``."""
        ...

    async def close(self, server: Server) -> None:
        """Release what ``push`` set up with the server (best effort: it may be gone)."""
        ...


async def post(server: Server, path: str, body: dict[str, Any], *, what: str) -> Any:
    """POST an update request; ``EngineUnavailable`` unless SGLang answered success."""
    url = f"{server.url}{path}"
    try:
        response = await server.client.post(url, json=body, timeout=None)
    except httpx.TransportError as exc:
        raise EngineUnavailable(f"{url} did not answer: {exc}") from exc
    data = response_json(response)
    if response.status_code >= 400 or not (isinstance(data, dict) and data.get("success")):
        raise EngineUnavailable(f"{url} refused {what} (HTTP {response.status_code}): {data}")
    return data


async def ranks_of(server: Server) -> int:
    """The server's tensor-parallel workers (``GET /get_server_info``)."""
    url = f"{server.url}/get_server_info"
    try:
        response = await server.client.get(url, timeout=60)
        response.raise_for_status()
        return server_ranks(response.json())
    except (httpx.HTTPError, ValueError, ProtocolError) as exc:
        raise EngineUnavailable(f"could not read {url}: {exc}") from exc


class DiskTransfer:
    """``weight_update = "disk"``: a model folder, then ``/update_weights_from_disk``."""

    def __init__(self, folders: WeightFolders) -> None:
        self.folders = folders

    async def push(self, server: Server, weights: Mapping[str, Any], version: int) -> None:
        folder = await asyncio.to_thread(self.folders.write, weights, version)
        body = {"model_path": str(folder), "weight_version": str(version)}
        try:
            await post(server, "/update_weights_from_disk", body, what=f"the weights in {folder}")
        except EngineUnavailable as exc:
            raise EngineUnavailable(
                f"{exc}. The folder must be readable by the server at that path ([engine] "
                f"weights_dir on a filesystem the servers share)"
            ) from exc
        await asyncio.to_thread(self.folders.prune, version)

    async def close(self, server: Server) -> None:
        return None


class DistributedTransfer:
    """``weight_update = "distributed"``: a process group with the server's workers, opened
    at the first update and kept; each update broadcast bucket by bucket."""

    def __init__(self, config: SglangEngineConfig, *, index: int = 0) -> None:
        self.config = config
        self.index = index
        self.group_name = ""
        self._group: Any = None

    @property
    def joined(self) -> bool:
        return self._group is not None

    async def _open(self, server: Server) -> None:
        world = await ranks_of(server) + 1
        # one group per server, and this process may hold several; a group given up after
        # a failure may linger on the server: every group gets a name of its own
        self.group_name = f"slr-weights-{self.index}-{uuid.uuid4().hex[:8]}"
        address = self.config.trainer_address or socket.gethostbyname(socket.gethostname())
        port = free_port(address)
        body = init_group_request(
            master_address=address,
            master_port=port,
            world_size=world,
            group_name=self.group_name,
            backend=self.config.weight_group_backend,
        )
        joining = asyncio.ensure_future(
            asyncio.to_thread(
                groups.join_group,
                master_address=address,
                master_port=port,
                rank=0,
                world_size=world,
                group_name=self.group_name,
                backend=self.config.weight_group_backend,
                timeout_s=self.config.weight_group_timeout_s,
            )
        )
        try:
            await post(server, "/init_weights_update_group", body, what="to join the weight group")
        except BaseException:
            # the server will not join: our end gives up at its timeout, then leaves
            joining.add_done_callback(_leave_when_joined)
            raise
        self._group = await joining
        log.info("sglang weight group joined", url=server.url, group=self.group_name, world=world)

    async def push(self, server: Server, weights: Mapping[str, Any], version: int) -> None:
        if self._group is None:
            await self._open(server)
        backend = self.config.weight_group_backend
        for bucket, last in _with_last(buckets(weights, self.config.weight_bucket_bytes)):
            tensors_ = [t for _, t in bucket]
            body = distributed_request(
                [name for name, _ in bucket],
                [groups.dtype_name(t) for t in tensors_],
                [list(t.shape) for t in tensors_],
                group_name=self.group_name,
                weight_version=version if last else None,
            )
            sending = asyncio.ensure_future(
                asyncio.to_thread(groups.send_bucket, self._group, tensors_, backend=backend)
            )
            try:
                await post(server, "/update_weights_from_distributed", body, what="a bucket")
                await sending
            except BaseException:
                # the group is out of step with the server: start a new one next time
                broken, self._group = self._group, None
                sending.add_done_callback(functools.partial(_leave_after, broken))
                raise
            # let go of this bucket before the one after next is read
            del bucket, tensors_, sending

    async def close(self, server: Server) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        try:
            body = destroy_group_request(self.group_name)
            await post(server, "/destroy_weights_update_group", body, what="to leave the group")
        except EngineUnavailable as exc:
            log.warning("sglang weight group not destroyed", url=server.url, error=str(exc))
        await asyncio.to_thread(groups.leave_group, group)


class TensorTransfer:
    """``weight_update = "tensor"``: each bucket handed over in shared memory."""

    def __init__(self, config: SglangEngineConfig) -> None:
        self.config = config
        self._ranks: int | None = None

    async def push(self, server: Server, weights: Mapping[str, Any], version: int) -> None:
        if self._ranks is None:
            self._ranks = await ranks_of(server)
        for bucket, last in _with_last(buckets(weights, self.config.weight_bucket_bytes)):
            payload, shared = await asyncio.to_thread(tensors.serialize, bucket)
            body = tensor_request(
                payload, ranks=self._ranks, weight_version=version if last else None
            )
            await post(server, "/update_weights_from_tensor", body, what="a bucket")
            # the server has copied the tensors in; let go of them before the next bucket
            del bucket, shared

    async def close(self, server: Server) -> None:
        return None


def transfer_for(
    config: SglangEngineConfig, *, index: int, folders: WeightFolders
) -> WeightTransfer | None:
    """The transfer ``[engine] weight_update`` names (None for ``"none"``)."""
    if config.weight_update == "distributed":
        return DistributedTransfer(config, index=index)
    if config.weight_update == "tensor":
        return TensorTransfer(config)
    if config.weight_update == "disk":
        return DiskTransfer(folders)
    return None


def _with_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Each item with whether it is the last (one item read ahead)."""
    iterator = iter(items)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


def _leave_after(group: Any, _: asyncio.Future[Any]) -> None:
    groups.leave_group(group)


def _leave_when_joined(joining: asyncio.Future[Any]) -> None:
    if not joining.cancelled() and joining.exception() is None:
        groups.leave_group(joining.result())
