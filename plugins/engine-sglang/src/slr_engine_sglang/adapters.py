"""LoRA updates on one SGLang server: SGLang serves adapters by name, loaded from a folder.

A ``"lora"`` update (``slr.contracts.weights.WeightUpdate``) never touches the server's
base weights. It is written as a peft adapter folder (``weights.WeightFolders``: once for
every replica, under ``[engine] weights_dir``), then:

1. ``POST /load_lora_adapter {"lora_name", "lora_path"}`` under a name of its own
   (``<served_model_name>-lora-<engine>-v<version>``): SGLang refuses to load a name it
   already holds, so an adapter is never replaced in place;
2. ``POST /update_weight_version``: the server's ``weight_version`` (and the per-token
   spans it reports) names the adapter's version;
3. ``POST /unload_lora_adapter`` for the previous adapter (best effort: a failure leaves
   it loaded, and only costs the server memory).

From then on every ``/generate`` names the current adapter (``lora_path``). The engine runs
all this inside its swap, as for a full update: no request of ours runs, so the previous
adapter is free to go at once.
"""

from __future__ import annotations

import asyncio
import uuid

import structlog

from slr.contracts import EngineUnavailable
from slr.contracts.weights import WeightUpdate
from slr.errors import UsageError
from slr_engine_sglang.config import SglangEngineConfig
from slr_engine_sglang.protocol import (
    load_lora_request,
    unload_lora_request,
    weight_version_request,
)
from slr_engine_sglang.transfer import Server, post
from slr_engine_sglang.weights import WeightFolders

log = structlog.get_logger()

_NEEDS = (
    "the server launched with --enable-lora, --max-lora-rank at least the adapter's rank "
    "and --lora-target-modules covering its modules (a launched server gets all three from "
    "[engine] max_lora_rank and lora_target_modules), and the adapter folder readable at "
    "its path ([engine] weights_dir on a filesystem the servers share)"
)


class Adapters:
    """The adapter one engine's server serves: checks, loads and swaps it per update."""

    def __init__(self, config: SglangEngineConfig, *, folders: WeightFolders, index: int) -> None:
        self.config = config
        self.folders = folders
        self.current: str | None = None  # the adapter every request names, once loaded
        # several engines (or a restarted one) may share a server: names never collide
        self._prefix = f"{config.served_model_name}-lora-{index}{uuid.uuid4().hex[:6]}"

    def check(self, update: WeightUpdate) -> None:
        """Refuse, before anything is sent, an adapter the server cannot take."""
        spec = update.lora
        assert spec is not None  # a "lora" update carries its spec
        limit = self.config.max_lora_rank
        if spec.rank > limit:
            raise UsageError(
                f"a rank-{spec.rank} LoRA update needs [engine] max_lora_rank >= {spec.rank} "
                f"(now {limit}): SGLang serves adapters only up to the rank it was launched "
                f"with (--max-lora-rank), and only with --enable-lora"
            )
        targets = set(self.config.lora_target_modules)
        if targets and "all" not in targets:
            outside = sorted({m.rsplit(".", 1)[-1] for m in spec.modules} - targets)
            if outside:
                raise UsageError(
                    f"the LoRA update adapts {outside}, outside [engine] lora_target_modules "
                    f"= {sorted(targets)} (--lora-target-modules): add them, or train "
                    f"([optimizer] target_modules) only on those"
                )

    async def load(self, server: Server, update: WeightUpdate, version: int) -> str:
        """Load ``update`` as version ``version`` and make it the adapter requests name."""
        folder = await asyncio.to_thread(self.folders.write, update, version)
        name = f"{self._prefix}-v{version}"
        try:
            await post(
                server,
                "/load_lora_adapter",
                load_lora_request(name, str(folder)),
                what=f"the LoRA adapter in {folder}",
            )
        except EngineUnavailable as exc:
            raise EngineUnavailable(f"{exc}. Loading adapters needs {_NEEDS}") from exc
        previous, self.current = self.current, name
        await post(
            server,
            "/update_weight_version",
            weight_version_request(version),
            what=f"weight version {version}",
        )
        if previous is not None:
            await self.unload(server, previous)
        await asyncio.to_thread(self.folders.prune, version)
        return name

    async def unload(self, server: Server, name: str) -> None:
        """Ask the server to drop adapter ``name`` (best effort)."""
        try:
            await post(server, "/unload_lora_adapter", unload_lora_request(name), what=name)
        except EngineUnavailable as exc:
            log.warning("sglang unload_lora_adapter failed", adapter=name, error=str(exc))

    async def close(self, server: Server) -> None:
        """Unload the current adapter (the engine calls it for a server it attached to)."""
        if self.current is not None:
            name, self.current = self.current, None
            await self.unload(server, name)
