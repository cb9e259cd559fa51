"""verl's platform for the CPU: a ``verl.plugin.platform`` plugin named ``cpu``.

verl picks its device through a platform registry (``verl.plugin.platform``): CUDA, NPU
and ROCm are built in, and when none is found it falls back to ``nvidia``, so on a machine
without a GPU every ``get_device_name()`` says ``cuda`` and every collective says ``nccl``.
The registry is verl's extension point for other hardware (``PlatformRegistry.register``,
chosen with ``VERL_PLATFORM``); this module registers the CPU through it, with ``gloo`` for
collectives. Nothing of verl's is replaced: importing this module adds a name, and
``select_cpu`` sets the environment variables verl reads.

verl's FSDP engine is registered for the ``cuda`` and ``npu`` devices only
(``verl/workers/engine/fsdp/transformer_impl.py``, the ``EngineRegistry.register`` above
``FSDPEngineWithLMHead``), although nothing in it needs CUDA once the platform answers
``cpu``; ``VERL_ENGINE_DEVICE`` (read by ``EngineRegistry.get_engine_cls``) selects the
engine registered for ``cuda`` while the platform stays ``cpu``.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM = "cpu"


def _device_module() -> SimpleNamespace:
    """``torch.cpu`` plus the calls verl makes on a device module that ``torch.cpu`` lacks
    (memory statistics, the device's name): they answer for host memory."""
    names = {name: getattr(torch.cpu, name) for name in dir(torch.cpu) if not name.startswith("_")}
    module = SimpleNamespace(**names)
    zero = lambda *args, **kwargs: 0  # noqa: E731 - allocator statistics: no device allocator
    none = lambda *args, **kwargs: None  # noqa: E731
    module.max_memory_allocated = zero
    module.max_memory_reserved = zero
    module.memory_allocated = zero
    module.memory_reserved = zero
    module.reset_peak_memory_stats = none
    module.empty_cache = none
    module.ipc_collect = none
    module.set_per_process_memory_fraction = none
    # verl's checkpoint manager stores the device's RNG under the device's name, which for
    # this platform is the host's own generator
    module.get_rng_state = torch.get_rng_state
    module.set_rng_state = torch.set_rng_state
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.get_device_name = lambda *args, **kwargs: "CPU"
    module.mem_get_info = lambda *args, **kwargs: (
        psutil.virtual_memory().available,
        psutil.virtual_memory().total,
    )
    return module


_DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=PLATFORM)
class CPUPlatform(PlatformBase):
    """The host CPU as verl's device: ``cpu`` tensors, ``gloo`` collectives."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never auto-detected: only VERL_PLATFORM=cpu selects it
        return False

    def current_device(self) -> Any:
        # verl passes this to .to(...) and torch.device(...): the CPU has no index
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return (None, None)

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "SLR_VERL_VISIBLE_CPUS"  # verl reads it only to pin GPUs; nothing to pin

    # verl's PlatformBase declares it with a bare `pass` body, so its inferred return is None,
    # yet verl uses it as a context manager (as its CUDA and NPU platforms define it)
    @contextlib.contextmanager
    def nvtx_range(self, msg: str):  # pyright: ignore[reportIncompatibleMethodOverride]
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def select_cpu() -> None:
    """Make verl run on the CPU in this process: its platform ``cpu`` and the FSDP engine.

    Must run before verl first asks for its platform (it decides once per process); a
    process where it already decided otherwise gets a clear error.
    """
    from verl.utils.device import get_device_name

    os.environ["VERL_PLATFORM"] = PLATFORM
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    name = get_device_name()
    if name != "cpu":
        from slr.errors import ConfigError

        raise ConfigError(
            f"verl already chose the {name!r} platform in this process, so the verl optimizer "
            f"cannot run on the CPU here; set VERL_PLATFORM=cpu in the environment of the "
            f"process that builds it (or build it in its own process, as the trainer actor does)"
        )
