"""The trainer as a Ray actor, reached through the ``Optimizer`` contract.

``[run] trainer_resources`` (e.g. ``{GPU = 1}``) moves the optimizer out of the driver:
``TrainerActor`` builds the run's ``[optimizer]`` plugin in its own process, on the node Ray
places it, and ``RemoteOptimizer`` is the driver-side ``Optimizer`` that calls it, so the
loops do not change.

Weights: ``export_weights`` returns a reference to the state dict the actor put in Ray's
object store (``by_reference``, when the engines are Ray replicas); the balancer passes that
one reference to every replica, which fetches it from the trainer's node: the weights never
go through the driver. With the engine embedded in the driver they are fetched once.

Checkpoints: the coordinator is the run directory's only writer. ``save`` has the actor write
its files into a folder of its own and send them back; the driver writes them into the
checkpoint folder. ``load`` sends a checkpoint's files to the actor, which restores from its
own copy.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from slr.cluster import ray_runtime
from slr.cluster.engines import START_TIMEOUT_S, actor_options, check_placeable
from slr.contracts import TrialResult
from slr.contracts.weights import portable
from slr.errors import UsageError

log = structlog.get_logger()


def _read_files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _write_files(folder: Path, files: Mapping[str, bytes]) -> None:
    for rel, data in files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _last_line(exc: BaseException) -> str:
    """The error itself, without the traceback Ray wraps around it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


class TrainerActor:
    """The body of the trainer (wrapped by ``ray.remote`` in ``start_trainer``)."""

    def __init__(self, config_data: dict[str, Any]) -> None:
        from slr.config import load_config
        from slr.plugins import get_plugin_manager

        plugins = get_plugin_manager()
        # the engine's section too: an optimizer may default to the engine's model
        config = load_config(
            data=config_data, plugins=plugins, only_plugins=("optimizer", "engine")
        )
        self.optimizer = plugins.build(config, "optimizer")
        self._scratch = tempfile.TemporaryDirectory(prefix="slr-trainer-")

    def describe(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def step(self, batch: list[TrialResult]) -> dict[str, Any]:
        return dict(self.optimizer.step(batch))

    def export_weights(self) -> Mapping[str, Any]:
        # returned through the object store: the caller gets a reference, not the tensors;
        # a WeightUpdate (a LoRA adapter) keeps its kind
        return portable(self.optimizer.export_weights())

    def save_files(self) -> dict[str, bytes]:
        folder = Path(self._scratch.name) / "save"
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        folder.mkdir()
        self.optimizer.save(folder)
        return _read_files(folder)

    def load_files(self, files: dict[str, bytes]) -> None:
        folder = Path(tempfile.mkdtemp(dir=self._scratch.name, prefix="load-"))
        _write_files(folder, files)
        self.optimizer.load(folder)

    def servable_weights(self, path: str) -> str | None:
        found = self.optimizer.servable_weights(Path(path))
        return None if found is None else str(found)


class RemoteOptimizer:
    """Implements ``slr.contracts.Optimizer`` by calling a ``TrainerActor``.

    ``by_reference``: ``export_weights`` returns an object reference (for Ray engine
    replicas) instead of the tensors."""

    def __init__(
        self,
        actor: Any,
        info: Mapping[str, Any],
        *,
        by_reference: bool,
        connection: ray_runtime.Connection | None = None,
    ) -> None:
        self.actor = actor
        self.node_id: str = info["node_id"]
        self.pid: int = info["pid"]
        self.by_reference = by_reference
        self._connection = connection

    def step(self, batch: Sequence[TrialResult]) -> Mapping[str, float]:
        import ray

        return ray.get(self.actor.step.remote(list(batch)))

    def export_weights(self) -> Any:
        import ray

        ref = self.actor.export_weights.remote()
        return ref if self.by_reference else ray.get(ref)

    def save(self, path: Path) -> None:
        import ray

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        _write_files(path, ray.get(self.actor.save_files.remote()))

    def load(self, path: Path) -> None:
        import ray

        ray.get(self.actor.load_files.remote(_read_files(Path(path))))

    def servable_weights(self, path: Path) -> Path | None:
        import ray

        found: str | None = ray.get(self.actor.servable_weights.remote(str(path)))
        return None if found is None else Path(found)

    def close(self) -> None:
        import ray

        ray.kill(self.actor)
        if self._connection is not None:
            self._connection.release()
            self._connection = None


def start_trainer(config: Any, *, by_reference: bool) -> RemoteOptimizer:
    """The ``[optimizer]`` plugin in a Ray actor placed by ``[run] trainer_resources``."""
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    resources = dict(config.run.trainer_resources or {})
    connection = ray_runtime.connect(config.run.ray_address)
    try:
        check_placeable(resources, 1, what="run.trainer_resources", count_key=None)
        remote = ray.remote(TrainerActor)
        actor: Any = remote.options(  # pyright: ignore[reportAttributeAccessIssue]
            max_restarts=0, **actor_options(resources)
        ).remote(config.to_dict())
        try:
            info: dict[str, Any] = ray.get(actor.describe.remote(), timeout=START_TIMEOUT_S)
        except (GetTimeoutError, RayError) as exc:
            ray.kill(actor)
            raise UsageError(
                f"the trainer asking {resources} did not start: {_last_line(exc)}. The "
                f"cluster has {ray.available_resources()} free; fix the optimizer's config "
                f"or change run.trainer_resources"
            ) from exc
    except BaseException:
        connection.release()
        raise
    log.info("trainer ready", node=info["node_id"][:12], resources=resources)
    return RemoteOptimizer(actor, info, by_reference=by_reference, connection=connection)
