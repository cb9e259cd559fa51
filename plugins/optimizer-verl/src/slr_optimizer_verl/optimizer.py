"""``VerlOptimizer``: the Optimizer contract on verl's own training worker and FSDP engine.

Construction::

    VerlOptimizer(options, algorithm=cfg.algorithm, temperature=cfg.rollout.temperature)
    VerlOptimizer.from_config(cfg)

One ``step(trials)``:

1. the torch optimizer's batch assembly and verl's advantage estimator by name (the same
   numbers both trainers train on), re-laid as verl's prompts + responses (``batch.py``);
2. ``old_logprobs = "recompute"``: verl's forward-only pass (``TrainingWorker.infer_batch``)
   for the ratio's denominator, as verl's trainer computes ``old_log_probs``;
3. for each epoch and mini-batch of whole groups: ``TrainingWorker.train_mini_batch``, one
   update: verl's dynamic micro-batches, verl's ``ppo_loss`` (the policy loss registered
   under ``[algorithm] policy_loss``, entropy), FSDP gradient clipping, AdamW.

The worker group (``group.make_group``) is verl's worker in this process at ``world_size =
1``, or ``world_size`` Ray actors (``ray_group.RayGroup``) that split each batch between
them; this class is the same over both. Weights go out through ``weight_buckets`` (a
generator of buckets of at most ``weight_bucket_bytes``, one parameter gathered at a time)
or ``export_weights`` (a mapping that gathers each tensor when read); checkpoints are
verl's checkpoint manager's, on every rank.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog
import torch
from slr_optimizer_torch import batch as batching
from slr_optimizer_torch.metrics import advantage_metrics, logprob_agreement, open_step
from slr_optimizer_torch.model import resolve_model_name
from slr_optimizer_torch.verl_config import algo_config, check_names

from slr.config import AlgorithmSection, Config
from slr.contracts import TrialResult
from slr.errors import ConfigError
from slr_optimizer_verl import checkpoint
from slr_optimizer_verl.batch import Layout, to_verl
from slr_optimizer_verl.config import VerlOptimizerConfig
from slr_optimizer_verl.group import make_group
from slr_optimizer_verl.verl_names import actor_config, worker_config
from slr_optimizer_verl.worker import ppo_loss_fn, resolve_device

log = structlog.get_logger()

#: verl's metric names (``TrainingWorker.train_mini_batch``) -> this optimizer's.
_METRICS = {
    "actor/pg_loss": "actor/pg_loss",
    "actor/pg_clipfrac": "actor/pg_clipfrac",
    "actor/ppo_kl": "actor/ppo_kl",
    "actor/pg_clipfrac_lower": "actor/pg_clipfrac_lower",
    "actor/entropy_loss": "actor/entropy",
    "loss": "actor/loss",
}


def _refuse_unsupported(algorithm: AlgorithmSection) -> None:
    """Options verl's trainer has but this optimizer does not wire yet, refused by name."""
    if algorithm.adv_estimator == "gae":
        raise ConfigError(
            "algorithm.adv_estimator = 'gae' needs verl's critic worker, which the verl "
            "optimizer does not build yet; use grpo, rloo or reinforce_plus_plus, or the "
            "torch optimizer for gae"
        )
    if algorithm.use_kl_loss:
        raise ConfigError(
            "algorithm.use_kl_loss = true needs a reference worker, which the verl optimizer "
            "does not build yet; set it false, or use the torch optimizer"
        )
    if algorithm.rollout_correction.configured:
        raise ConfigError(
            "[algorithm.rollout_correction] is not wired into the verl optimizer yet; remove "
            "it, or use the torch optimizer"
        )


class VerlOptimizer:
    """``slr.contracts.Optimizer`` on verl's ``TrainingWorker`` (see the module docstring)."""

    def __init__(
        self,
        options: VerlOptimizerConfig | None = None,
        *,
        algorithm: AlgorithmSection,
        temperature: float,
        ray_address: str | None = None,
    ) -> None:
        self.options = options = options or VerlOptimizerConfig()
        if temperature <= 0:
            raise ConfigError(
                f"rollout.temperature = {temperature} cannot be trained on: greedy decoding "
                f"has no sampling distribution to score. Use a temperature > 0 (1.0 is usual)."
            )
        if not options.model:
            raise ConfigError(
                "the verl optimizer has no model to train: set [optimizer] model (a Hugging "
                "Face model folder), or [engine] model for the engine and optimizer together"
            )
        check_names(algorithm)
        _refuse_unsupported(algorithm)
        self.algorithm = algorithm
        self.temperature = float(temperature)
        self.device = resolve_device(options.device)
        self.model_path = resolve_model_name(options.model)
        self.actor_cfg = actor_config(algorithm, options)
        self.algo_cfg = algo_config(algorithm)
        try:
            config = worker_config(options, model_path=self.model_path, device=self.device)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"cannot load model {self.model_path!r} for the verl optimizer: {first}. Point "
                f"[optimizer] model at a Hugging Face model folder (config.json + weights)."
            ) from exc
        # world size 1: verl's worker in this process; N >= 2: N Ray actors (group.py)
        self.group = make_group(
            config,
            loss_fn=ppo_loss_fn(self.actor_cfg),
            device=self.device,
            world_size=options.world_size,
            ray_address=ray_address,
        )
        self.generator = torch.Generator().manual_seed(options.seed)
        self.steps = 0
        self.updates = 0

    @classmethod
    def from_config(cls, config: Config) -> VerlOptimizer:
        options = config.optimizer.options or VerlOptimizerConfig()
        if not options.model:
            engine_model = getattr(config.engine.options, "model", "") or ""
            options = attrs.evolve(options, model=str(engine_model))
        return cls(
            options,
            algorithm=config.algorithm,
            temperature=config.rollout.temperature,
            ray_address=config.run.ray_address,
        )

    def close(self) -> None:
        self.group.close()

    # -- the step ------------------------------------------------------------------------

    def _meta(self, td: Any, **extra: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        tu.assign_non_tensor(td, temperature=self.temperature, **extra)
        return td

    def logprobs(self, tb: batching.TrainBatch, layout: Layout | None = None) -> torch.Tensor:
        """verl's forward-only log-probs of ``tb``'s tokens, in the torch layout ``(B, L-1)``."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

        layout = layout or Layout.of(tb)
        rows = list(range(tb.num_sequences))
        td = left_right_2_no_padding(to_verl(tb, rows, layout=layout))
        self._meta(td, calculate_entropy=False, compute_loss=False)
        out = self.group.infer(td)
        response = no_padding_2_padding(tu.get(out, "log_probs"), td).float().cpu()
        width = tb.response_mask.shape[1]
        return layout.shifted(response, rows, width) * tb.response_mask

    def step(self, batch: Sequence[TrialResult]) -> dict[str, float]:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        started = time.perf_counter()
        opts, algo = self.options, self.algorithm
        tb, metrics = open_step(batch, opts, step=self.steps)
        self.steps += 1
        if tb.num_policy_tokens == 0:
            metrics["optimizer/updates"] = float(self.updates)
            return metrics

        layout = Layout.of(tb)
        t0 = time.perf_counter()
        if opts.old_logprobs == "rollout":
            old = tb.rollout_logprobs
        else:
            old = self.logprobs(tb, layout)
            metrics.update(logprob_agreement(tb.rollout_logprobs, old, tb.response_mask))
        metrics["perf/prepass_s"] = time.perf_counter() - t0

        tb.advantages, tb.returns = batching.compute_advantages(
            tb, algo.adv_estimator, self.algo_cfg
        )
        metrics.update(advantage_metrics(tb.advantages, tb.response_mask))

        several = 0 < opts.ppo_mini_batch_size < len(set(tb.group_ids))
        sums: dict[str, float] = {}
        grad_norms: list[float] = []
        updates = 0
        t0 = time.perf_counter()
        for _ in range(opts.ppo_epochs):
            shuffle = self.generator if several else None
            for trials in batching.mini_batches(tb.group_ids, opts.ppo_mini_batch_size, shuffle):
                members = set(trials)
                rows = [r for r in range(tb.num_sequences) if int(tb.seq_trial[r]) in members]
                if not rows:
                    continue
                td = left_right_2_no_padding(to_verl(tb, rows, old_log_probs=old, layout=layout))
                self._meta(
                    td,
                    calculate_entropy=True,
                    compute_loss=True,
                    global_batch_size=len(rows),
                    mini_batch_size=len(rows),
                    epochs=1,
                    seed=0,
                    dataloader_kwargs={"shuffle": False},
                )
                out = tu.get(self.group.train(td), "metrics")
                updates += 1
                for theirs, ours in _METRICS.items():
                    if theirs in out:
                        sums[ours] = sums.get(ours, 0.0) + float(sum(out[theirs]))
                for norm in out.get("grad_norm", []):
                    if math.isfinite(float(norm)):
                        grad_norms.append(float(norm))
        update_s = time.perf_counter() - t0
        self.updates += len(grad_norms)
        metrics.update({k: v / max(updates, 1) for k, v in sums.items()})
        metrics["update/count"] = float(updates)
        metrics["update/nonfinite_grad_skipped"] = float(updates - len(grad_norms))
        if grad_norms:
            metrics["actor/grad_norm"] = sum(grad_norms) / len(grad_norms)
            metrics["actor/grad_norm_max"] = max(grad_norms)
        metrics["optimizer/updates"] = float(self.updates)
        metrics["actor/lr"] = opts.lr
        metrics["perf/update_s"] = update_s
        metrics["perf/step_s"] = time.perf_counter() - started
        return metrics

    # -- weights and checkpoints ---------------------------------------------------------

    def weight_buckets(
        self, max_bytes: int | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's weights as buckets of ``(name, tensor)`` of at most ``max_bytes``
        (``[optimizer] weight_bucket_bytes``; a larger tensor is a bucket of its own), one
        parameter gathered from its FSDP shards at a time, on every rank of the group. Only
        one bucket is held at a time: nothing copies the whole state dict."""
        yield from self.group.weight_buckets(max_bytes or self.options.weight_bucket_bytes)

    def export_weights(self) -> Mapping[str, torch.Tensor]:
        """The policy's weights as a mapping that gathers each tensor when it is read."""
        return self.group.export_weights()

    def save(self, path: Path) -> None:
        checkpoint.save(self, path)

    def load(self, path: Path) -> None:
        checkpoint.load(self, path)

    def servable_weights(self, path: Path) -> Path:
        return checkpoint.servable_weights(path)
