"""The verl optimizer over several ranks: verl's ``RayWorkerGroup`` of ``TrainingWorker``s.

``[optimizer] world_size = N`` (N >= 2) starts N Ray actors (``rank.RankWorker``, one process
each) with verl's own single controller: a ``RayResourcePool`` of N bundles packed on one
node (``{CPU: 1}`` each, plus ``{GPU: 1}`` on cuda), ``RayClassWithInitArgs`` and
``RayWorkerGroup``, which gives every rank its ``RANK`` / ``WORLD_SIZE`` / master address.
verl's FSDP engine shards the model over the N ranks. Ray is the run's (``[run]
ray_address``, through ``slr.cluster.ray_runtime``): a private local Ray when none is running.

A batch goes out the way verl's trainer sends it: reordered so each rank gets about the
same work, filled to a multiple of N (``dispatch.for_ranks``), then verl's dispatch cuts it
into N chunks; verl reduces the loss and metrics over the ranks (``batch_num_tokens`` and
``dp_size`` in its loss, ``Metric.aggregate_dp``), and log-probs come back in the caller's
order. The surface is ``worker.WorkerGroup``'s (``infer``, ``train``, ``save``, ``load``,
``weight_buckets``, ``export_weights``, ``close``); there is no engine in this process.

Every call waits on all ranks at once: a rank that dies or raises stops the group (the
others would wait in their collectives forever) and the caller gets ``RankFailed`` naming
the rank, never a hang.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import structlog
import torch

from slr.errors import SlrError, UsageError
from slr_optimizer_verl import dispatch, refusals, weights

log = structlog.get_logger()


class RankFailed(SlrError):
    """A rank of the verl optimizer's worker group died or raised; the group is stopped."""


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _check_room(world_size: int, device: str) -> None:
    """Fail at once when no Ray node can ever hold the ranks (Ray would wait forever)."""
    from slr.cluster.ray_runtime import live_nodes

    refusal = refusals.unplaceable(live_nodes(), world_size, device)
    if refusal is not None:
        problem, fix = refusal
        raise UsageError(f"{problem}; {fix}")


class RayGroup:
    """``world_size`` ranks of verl's ``TrainingWorker`` as Ray actors (module docstring)."""

    def __init__(
        self,
        config: Any,
        *,
        loss_fn: Any,
        device: str,
        world_size: int,
        ray_address: str | None = None,
    ) -> None:
        from slr.cluster import ray_runtime

        if world_size < 2:
            raise ValueError(f"a Ray worker group needs world_size >= 2, not {world_size}")
        self.world_size = world_size
        self.device = device
        self._wg: Any = None
        self._connection: Any = None
        if device == "cpu":
            # the driver's verl answers "cpu" too (its resource pool asks the platform)
            from slr_optimizer_verl.cpu_platform import select_cpu

            select_cpu()
        self._connection = ray_runtime.connect(
            ray_address, num_cpus=max(os.cpu_count() or 1, world_size)
        )
        try:
            self._start(config, loss_fn)
        except BaseException:
            self.close()
            raise

    def _start(self, config: Any, loss_fn: Any) -> None:
        import ray
        from verl.single_controller.ray import (
            RayClassWithInitArgs,
            RayResourcePool,
            RayWorkerGroup,
        )

        from slr_optimizer_verl.rank import RankWorker

        _check_room(self.world_size, self.device)
        env = {}
        if self.device == "cpu":
            env = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}
        pool = RayResourcePool(
            process_on_nodes=[self.world_size],
            use_gpu=self.device == "cuda",
            max_colocate_count=1,
            name_prefix="slr_verl_",
        )
        actor = RayClassWithInitArgs(ray.remote(RankWorker), config=config, device=self.device)
        log.info("optimizer.verl.group.start", device=self.device, world_size=self.world_size)
        self._wg = RayWorkerGroup(
            resource_pool=pool, ray_cls_with_init=actor, device_name=self.device, worker_env=env
        )
        self.ranks: list[dict[str, Any]] = self._call("describe", "start")
        self._call("set_loss_fn", "start", loss_fn=loss_fn)
        self._call("reset", "start")  # builds the model, FSDP over the ranks, the optimizer

    # -- calls on every rank, failing fast -------------------------------------------

    @property
    def workers(self) -> list[Any]:
        if self._wg is None:
            raise RuntimeError("the verl optimizer was closed; build a new one")
        return list(self._wg.workers)

    def _wait(self, refs: list[Any], what: str) -> list[Any]:
        """Each rank's result; the first rank that failed stops the group (``RankFailed``)."""
        import ray

        results: list[Any] = [None] * len(refs)
        index = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    results[index[ref]] = ray.get(ref)
                except Exception as exc:
                    self._fail(index[ref], what, exc)
        return results

    def _fail(self, rank: int, what: str, exc: BaseException) -> None:
        n = self.world_size
        self.close()
        raise RankFailed(
            f"rank {rank} of the verl optimizer's {n} ranks failed during {what}: "
            f"{_last_line(exc)}; the other ranks were stopped (they would wait for it "
            f"forever). Restart the run (slr run --resume continues from the last checkpoint)"
        ) from exc

    def _call(self, method: str, what: str, *args: Any, **kwargs: Any) -> list[Any]:
        if self._wg is None:
            raise RuntimeError("the verl optimizer was closed; build a new one")
        return self._wait(self._wg.execute_all_async(method, *args, **kwargs), what)

    def _data(self, method: str, what: str, td: Any) -> Any:
        """verl's data dispatch (chunks by data-parallel rank), waited on all ranks at once."""
        if self._wg is None:
            raise RuntimeError("the verl optimizer was closed; build a new one")
        future = getattr(self._wg, method)(td)  # blocking=False in verl: a DataProtoFuture
        self._wait(list(future.futures), what)
        return future.get()

    # -- WorkerGroup's surface -------------------------------------------------------

    @property
    def engine(self) -> Any:
        raise AttributeError(
            "the verl optimizer's engine lives in its rank processes at world_size > 1; "
            "use weight_buckets / export_weights"
        )

    def infer(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        spread, keep = dispatch.for_ranks(data, self.world_size)
        out = self._data("infer_batch", "infer", spread)
        return tu.index_select_tensor_dict(out, keep)

    def train(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        spread, _ = dispatch.for_ranks(data, self.world_size)
        size = tu.get(data, "mini_batch_size")
        if size is not None and size != len(data):
            raise ValueError(
                f"the Ray worker group trains one mini-batch per call (mini_batch_size = "
                f"{size}, rows = {len(data)})"
            )
        # the filler rows ride along in the mini-batch; global_batch_size stays the real rows
        tu.assign_non_tensor(spread, mini_batch_size=len(spread))
        return self._data("train_mini_batch", "train", spread)

    def save(self, path: str, step: int) -> None:
        self._call("save_checkpoint", "save", local_path=path, global_step=step)

    def load(self, path: str) -> None:
        self._call("load_checkpoint", "load", local_path=path, del_local_after_load=False)

    def _gather(self, names: list[str]) -> weights.Named:
        got = self._call("gather_weights", "weight export", names)[0]
        assert got is not None  # rank 0 returns the tensors
        return got

    def weight_buckets(self, max_bytes: int) -> Iterator[weights.Named]:
        """Buckets of at most ``max_bytes``: the ranks gather one bucket's parameters, rank 0
        sends them; only that bucket is held anywhere."""
        sizes = self._call("weight_sizes", "weight export")[0]
        for names in weights.plan_buckets(sizes, max_bytes):
            yield self._gather(names)

    def export_weights(self) -> Mapping[str, torch.Tensor]:
        sizes = self._call("weight_sizes", "weight export")[0]
        return weights.GatheredWeights([name for name, _ in sizes], self._gather)

    def close(self) -> None:
        import ray

        wg, self._wg = self._wg, None
        if wg is not None:
            for worker in wg.workers:
                ray.kill(worker)
            for pg in getattr(wg.resource_pool, "pgs", None) or []:
                ray.util.remove_placement_group(pg)
        if self._connection is not None:
            self._connection.release()
            self._connection = None
