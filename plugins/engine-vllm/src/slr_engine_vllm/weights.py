"""Pushing new weights into a vLLM server with vLLM's weight-transfer API.

vLLM (dev mode, ``VLLM_SERVER_DEV_MODE=1``, launched with ``--weight-transfer-config
'{"backend": "nccl"}'``) serves a control plane over HTTP while the tensors travel over
NCCL from the trainer (rank 0) to the server's workers (ranks 1..N):

1. once: ``GET /get_world_size``, then ``POST /init_weight_transfer_engine`` with
   ``{"init_info": {master_address, master_port, rank_offset: 1, world_size: N + 1}}``
   while the trainer joins the same group (``NCCLWeightTransferEngine.trainer_init``);
2. per update: ``POST /pause`` (in-flight requests finish, new ones wait), then
   ``POST /update_weights`` with ``{"update_info": {names, dtype_names, shapes, packed}}``
   while the trainer broadcasts the tensors (``trainer_send_weights``), then
   ``POST /resume``.

A LoRA update (``slr.contracts.weights.WeightUpdate``, kind ``"lora"``) takes another path:
the adapter is written as a peft folder (``slr.engines.lora``) where the server reads it, then
``POST /pause``, ``POST /v1/load_lora_adapter`` with ``{"lora_name", "lora_path",
"load_inplace": true}`` (the same name each time: the adapter's weights are replaced in
place), ``POST /resume``; requests then name the adapter as their ``model``. The server
needs ``--enable-lora --max-lora-rank N`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``.

The NCCL side needs ``vllm`` and a GPU in the trainer process; it is imported only when a
first update happens. ``Transport`` is the seam: tests drive the HTTP sequence with a
stand-in transport, since neither vLLM nor NCCL can run without a GPU.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import httpx
from attrs import frozen

from slr.contracts import EngineUnavailable
from slr.contracts.weights import WeightUpdate
from slr.engines.lora import write_adapter
from slr.errors import UsageError

_FULL_NEEDS = (
    "the server in dev mode (VLLM_SERVER_DEV_MODE=1) and launched with --weight-transfer-config"
)
_DISK_NEEDS = (
    "the server in dev mode (VLLM_SERVER_DEV_MODE=1, for /pause, /collective_rpc and "
    "/reset_prefix_cache) and able to read the weights folder at the same path"
)
_LORA_NEEDS = (
    "the server in dev mode (VLLM_SERVER_DEV_MODE=1), launched with --enable-lora and "
    "--max-lora-rank at least the adapter's, and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
    "(a launched server gets all three with [engine] max_lora_rank)"
)


class Transport(Protocol):
    """The data plane: join the group once, then send every update's tensors."""

    def init(self, init_info: dict[str, Any]) -> None: ...

    def send(self, state_dict: Mapping[str, Any]) -> None: ...


class NcclTransport:
    """The trainer side of vLLM's NCCL weight transfer (needs vllm + CUDA here)."""

    def __init__(self) -> None:
        self._group: Any = None

    def init(self, init_info: dict[str, Any]) -> None:
        engine = _nccl_engine()
        self._group = engine.trainer_init(
            {
                "master_address": init_info["master_address"],
                "master_port": init_info["master_port"],
                "world_size": init_info["world_size"],
            }
        )

    def send(self, state_dict: Mapping[str, Any]) -> None:
        _nccl_engine().trainer_send_weights(
            iter(state_dict.items()), {"group": self._group, "packed": True}
        )


def _nccl_engine() -> Any:
    try:
        # vllm is the GPU trainer's own dependency, not this distribution's.
        from vllm.distributed.weight_transfer.nccl_engine import (  # pyright: ignore[reportMissingImports]
            NCCLWeightTransferEngine,
        )
    except ImportError as exc:
        raise UsageError(
            "pushing weights to vLLM over NCCL needs vllm installed in the trainer process "
            f"(and a GPU): {exc}"
        ) from exc
    return NCCLWeightTransferEngine


def update_info(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """What the server needs to receive the broadcast: names, dtypes and shapes, in order."""
    return {
        "names": list(state_dict),
        "dtype_names": [str(t.dtype).removeprefix("torch.") for t in state_dict.values()],
        "shapes": [list(t.shape) for t in state_dict.values()],
        "packed": True,
    }


@frozen(kw_only=True)
class Server:
    """Where one update's control-plane requests go."""

    url: str
    client: httpx.AsyncClient


class WeightSync:
    """Runs the update sequence for one server.

    ``push`` is given the server's URL and an HTTP client for the running event loop at each
    call: the engine owns both (it learns the URL at start and keeps a client per loop).
    """

    def __init__(
        self,
        transport: Transport | None = None,
        *,
        trainer_address: str | None = None,
    ) -> None:
        self.transport = transport if transport is not None else NcclTransport()
        self.trainer_address = trainer_address
        self._initialized = False

    async def _post(
        self, server: Server, path: str, *, needs: str = _FULL_NEEDS, **kwargs: Any
    ) -> Any:
        url = f"{server.url}{path}"
        response = await server.client.post(url, timeout=None, **kwargs)
        if response.status_code >= 400:
            raise EngineUnavailable(
                f"{url} answered HTTP {response.status_code}: {response.text[:300]}. "
                f"Weight updates need {needs}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:  # /v1/load_lora_adapter answers plain text ("Success: ...")
            return response.text

    async def load_adapter(
        self,
        update: WeightUpdate,
        *,
        url: str,
        client: httpx.AsyncClient,
        name: str,
        folder: Path,
    ) -> None:
        """Write the LoRA ``update`` into ``folder`` and have the server at ``url`` load it
        as ``name``, in place of the adapter it had under that name."""
        server = Server(url=url, client=client)
        await asyncio.to_thread(write_adapter, folder, update)
        await self._post(
            server,
            "/pause",
            needs=_LORA_NEEDS,
            params={"mode": "wait", "wait_for_inflight_requests": "true"},
        )
        try:
            await self._post(
                server,
                "/v1/load_lora_adapter",
                needs=_LORA_NEEDS,
                json=load_adapter_request(name, folder),
            )
        finally:
            await self._post(server, "/resume", needs=_LORA_NEEDS)

    async def _init(self, server: Server) -> None:
        response = await server.client.get(f"{server.url}/get_world_size", timeout=60)
        response.raise_for_status()
        server_world = int(response.json()["world_size"])
        address = self.trainer_address or socket.gethostbyname(socket.gethostname())
        with socket.socket() as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        init_info = {
            "master_address": address,
            "master_port": port,
            "rank_offset": 1,
            "world_size": server_world + 1,
        }
        # both sides must enter the rendezvous at once, or each waits for the other forever
        await asyncio.gather(
            self._post(server, "/init_weight_transfer_engine", json={"init_info": init_info}),
            asyncio.to_thread(self.transport.init, init_info),
        )
        self._initialized = True

    async def push(
        self, state_dict: Mapping[str, Any], *, url: str, client: httpx.AsyncClient
    ) -> None:
        """Pause the server at ``url``, send ``state_dict`` into it, resume it."""
        server = Server(url=url, client=client)
        if not self._initialized:
            await self._init(server)
        await self._post(
            server, "/pause", params={"mode": "wait", "wait_for_inflight_requests": "true"}
        )
        try:
            update = {"update_info": update_info(state_dict)}
            await asyncio.gather(
                self._post(server, "/update_weights", json=update),
                asyncio.to_thread(self.transport.send, state_dict),
            )
        finally:
            await self._post(server, "/resume")

    async def load_folder(self, folder: Path, *, url: str, client: httpx.AsyncClient) -> None:
        """Have the server at ``url`` load ``folder`` (``write_checkpoint``'s) in place of
        its weights: ``POST /pause?mode=wait`` (in-flight requests finish, new ones wait),
        ``POST /collective_rpc`` with ``reload_weights`` and ``weights_path=folder`` (every
        worker reads the folder through vLLM's own checkpoint loader, so names are the
        model's Hugging Face names), ``POST /reset_prefix_cache`` (cached prefixes were
        computed by the old weights), then ``POST /resume``. Works on every vLLM platform,
        its CPU build included."""
        server = Server(url=url, client=client)
        await self._post(
            server, "/pause", needs=_DISK_NEEDS, params={"mode": "wait", "clear_cache": "true"}
        )
        try:
            await self._post(
                server, "/collective_rpc", needs=_DISK_NEEDS, json=reload_request(folder)
            )
            await self._post(server, "/reset_prefix_cache", needs=_DISK_NEEDS)
        finally:
            await self._post(server, "/resume", needs=_DISK_NEEDS)


def write_checkpoint(folder: Path, state_dict: Mapping[str, Any]) -> Path:
    """``folder/model.safetensors`` holding ``state_dict`` (contiguous CPU tensors; tied
    tensors written once each under their own name)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()}
    path = folder / "model.safetensors"
    tmp = folder / "model.safetensors.partial"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)  # the server never reads half a file
    return path


def reload_request(folder: Path) -> dict[str, Any]:
    """The body of vLLM's ``/collective_rpc`` that reloads the weights found in ``folder``."""
    return {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}


def load_adapter_request(name: str, folder: Path) -> dict[str, Any]:
    """The body of vLLM's ``/v1/load_lora_adapter`` for replacing adapter ``name``."""
    return {"lora_name": name, "lora_path": str(folder), "load_inplace": True}
