"""``VerlOptimizer``: the Optimizer contract on verl's own training worker and FSDP engine.

Construction::

    VerlOptimizer(options, algorithm=cfg.algorithm, temperature=cfg.rollout.temperature)
    VerlOptimizer.from_config(cfg)

One ``step(trials)``:

1. the torch optimizer's batch assembly and verl's advantage estimator by name (the same
   numbers both trainers train on), re-laid as verl's prompts + responses (``batch.py``);
2. ``old_logprobs = "recompute"``: verl's forward-only pass (``TrainingWorker.infer_batch``)
   for the ratio's denominator, as verl's trainer computes ``old_log_probs``;
   with ``use_kl_loss``, the reference worker's log-probs (``ref_log_prob``); with ``gae``,
   the critic worker's values, which verl's ``gae`` turns into advantages and returns;
3. ``[algorithm.rollout_correction]``, as verl's trainer applies it (the torch optimizer's
   ``correction.py``, verl's ``rollout_corr_helper``): decoupled mode weighs the batch by the
   IS weights and drops rejected tokens from the loss mask; bypass mode makes the rollout's
   log-probs the old ones and the policy loss verl's ``bypass_mode``;
4. for each epoch and mini-batch of whole groups: the critic's ``train_mini_batch`` (verl's
   ``value_loss``), then the actor's, one update each: verl's dynamic micro-batches, verl's
   ``ppo_loss`` (the policy loss registered under ``[algorithm] policy_loss``, entropy, the
   KL loss), FSDP gradient clipping, AdamW.

Each role (actor, reference, critic) is its own verl worker group with its own config, made
by ``roles.build_group``, as verl's trainer makes them. With LoRA the reference is the actor
with its adapter disabled (verl's ``ref_in_actor``) and only the adapter is exported.

The worker group (``group.make_group``) is verl's worker in this process at ``world_size =
1``, or ``world_size`` Ray actors (``ray_group.RayGroup``) that split each batch between
them; this class is the same over both. Weights go out through ``weight_buckets`` (a
generator of buckets of at most ``weight_bucket_bytes``, one parameter gathered at a time)
or ``export_weights`` (a mapping that gathers each tensor when read); checkpoints are
verl's checkpoint manager's, on every rank.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog
import torch
from slr_optimizer_torch import batch as batching
from slr_optimizer_torch.correction import offpolicy_metrics, resolve
from slr_optimizer_torch.metrics import advantage_metrics, logprob_agreement, open_step
from slr_optimizer_torch.model import resolve_model_name
from slr_optimizer_torch.verl_config import algo_config, check_names

from slr.config import AlgorithmSection, Config
from slr.contracts import TrialResult
from slr.contracts.weights import LoraSpec
from slr.errors import ConfigError
from slr_optimizer_verl import checkpoint, lora, refusals
from slr_optimizer_verl.batch import Layout, to_verl
from slr_optimizer_verl.config import VerlOptimizerConfig
from slr_optimizer_verl.fused import ClassForward
from slr_optimizer_verl.roles import build_group, value_loss_fn
from slr_optimizer_verl.verl_names import (
    actor_config,
    critic_config,
    critic_worker_config,
    ref_worker_config,
    worker_config,
)
from slr_optimizer_verl.worker import WorkerGroup, ppo_loss_fn, resolve_device

log = structlog.get_logger()

#: verl's metric names (``TrainingWorker.train_mini_batch``) -> this optimizer's.
_METRICS = {
    "actor/pg_loss": "actor/pg_loss",
    "actor/pg_clipfrac": "actor/pg_clipfrac",
    "actor/ppo_kl": "actor/ppo_kl",
    "actor/pg_clipfrac_lower": "actor/pg_clipfrac_lower",
    "actor/entropy_loss": "actor/entropy",
    "kl_loss": "actor/kl_loss",
    "loss": "actor/loss",
}
#: the same for the critic's ``value_loss``.
_CRITIC_METRICS = {
    "critic/vf_loss": "critic/vf_loss",
    "critic/vf_clipfrac": "critic/vf_clipfrac",
    "critic/vpred_mean": "critic/vpred_mean",
}


def _refuse(algorithm: AlgorithmSection, options: VerlOptimizerConfig) -> None:
    """What the preflight refuses (``refusals``), raised here too: a run started with
    ``--skip-preflight``, or an optimizer built outside a run."""
    for refusal in (refusals.routing_replay(algorithm), refusals.multi_rank(algorithm, options)):
        if refusal is not None:
            problem, fix = refusal
            raise ConfigError(f"{problem}; {fix}")


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
        _refuse(algorithm, options)
        self.correction = resolve(algorithm, options)
        self.algorithm = algorithm
        self.temperature = float(temperature)
        self.device = resolve_device(options.device)
        self.model_path = resolve_model_name(options.model)
        self.actor_cfg = actor_config(algorithm, options, self.correction)
        self.algo_cfg = algo_config(algorithm)
        self.critic_cfg = critic_config(algorithm, options)
        gae = algorithm.adv_estimator == "gae"
        # with LoRA the reference is the actor without its adapter (verl's ref_in_actor)
        separate_ref = algorithm.use_kl_loss and options.lora_rank == 0
        critic_path = resolve_model_name(options.critic_model or options.model)
        with _loading(self.model_path, "model"):
            config = worker_config(options, model_path=self.model_path, device=self.device)
            ref_config = (
                ref_worker_config(options, model_path=self.model_path, device=self.device)
                if separate_ref
                else None
            )
        with _loading(critic_path, "critic_model"):
            critic = (
                critic_worker_config(
                    options,
                    model_path=critic_path,
                    tokenizer_path=self.model_path,
                    device=self.device,
                )
                if gae
                else None
            )
        self.ref: WorkerGroup | None = None
        self.critic: WorkerGroup | None = None
        # verl's fused path replaces the model class's forward process-wide (fused.py)
        self._forward = ClassForward.of(config) if options.use_fused_kernels else None
        try:
            self.group = build_group(
                "actor",
                config,
                loss_fn=ppo_loss_fn(self.actor_cfg),
                device=self.device,
                world_size=options.world_size,
                ray_address=ray_address,
            )
            if ref_config is not None:
                self.ref = build_group("ref", ref_config, loss_fn=None, device=self.device)
            if critic is not None:
                self.critic = build_group(
                    "critic", critic, loss_fn=value_loss_fn(self.critic_cfg), device=self.device
                )
        except BaseException as exc:
            self.close()
            if options.lora_rank > 0 and isinstance(exc, ValueError) and "target" in str(exc):
                first = str(exc).strip().splitlines()[0]
                raise ConfigError(
                    f"[optimizer] target_modules = {options.target_modules!r} does not fit "
                    f"{self.model_path!r}: {first}. Write 'all-linear', or module names such as "
                    f"['q_proj', 'v_proj']"
                ) from exc
            raise
        self.lora: LoraSpec | None = None
        if options.lora_rank > 0:
            self.lora = lora.spec(
                self.group.engine.module,
                rank=options.lora_rank,
                alpha=options.lora_alpha,
                base_model=self.model_path,
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
        # the actor's group started the process group: it goes last
        for group in (self.critic, self.ref, getattr(self, "group", None)):
            if group is not None:
                group.close()
        if self._forward is not None:
            self._forward.restore()

    # -- the step ------------------------------------------------------------------------

    def _meta(self, td: Any, **extra: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        tu.assign_non_tensor(td, temperature=self.temperature, **extra)
        return td

    def _infer(
        self,
        group: Any,
        key: str,
        tb: batching.TrainBatch,
        layout: Layout | None,
        **meta: Any,
    ) -> torch.Tensor:
        """``group``'s forward-only ``key`` (log_probs, values) of ``tb``'s tokens, in the
        torch layout ``(B, L-1)``, zero off the response mask."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

        layout = layout or Layout.of(tb)
        rows = list(range(tb.num_sequences))
        td = left_right_2_no_padding(to_verl(tb, rows, layout=layout))
        self._meta(td, calculate_entropy=False, compute_loss=False, **meta)
        out = group.infer(td)
        response = no_padding_2_padding(tu.get(out, key), td).float().cpu()
        width = tb.response_mask.shape[1]
        return layout.shifted(response, rows, width) * tb.response_mask

    def logprobs(self, tb: batching.TrainBatch, layout: Layout | None = None) -> torch.Tensor:
        """verl's forward-only log-probs of ``tb``'s tokens, in the torch layout ``(B, L-1)``."""
        return self._infer(self.group, "log_probs", tb, layout)

    def ref_logprobs(self, tb: batching.TrainBatch, layout: Layout | None = None) -> torch.Tensor:
        """The reference policy's log-probs (the KL loss's), in the torch layout: the
        reference worker's, or with LoRA the actor's with its adapter disabled (verl's
        ``no_lora_adapter``)."""
        if self.ref is not None:
            return self._infer(self.ref, "log_probs", tb, layout)
        if self.lora is None:
            raise RuntimeError("no reference policy: build the optimizer with use_kl_loss")
        return self._infer(self.group, "log_probs", tb, layout, no_lora_adapter=True)

    def values(self, tb: batching.TrainBatch, layout: Layout | None = None) -> torch.Tensor:
        """The critic's values of ``tb``'s policy positions (gae), in the torch layout."""
        if self.critic is None:
            raise RuntimeError("no critic: build the optimizer with adv_estimator = 'gae'")
        return self._infer(self.critic, "values", tb, layout)

    def step(self, batch: Sequence[TrialResult]) -> dict[str, float]:
        started = time.perf_counter()
        opts, algo = self.options, self.algorithm
        tb, metrics = open_step(batch, opts, step=self.steps)
        self.steps += 1
        if tb.num_policy_tokens == 0:
            metrics["optimizer/updates"] = float(self.updates)
            return metrics

        corr = self.correction
        bypass = corr is not None and corr.bypass
        layout = Layout.of(tb)
        t0 = time.perf_counter()
        pre: torch.Tensor | None = None
        if opts.old_logprobs == "rollout" or bypass:
            old = tb.rollout_logprobs  # verl's apply_bypass_mode: no old log-prob pass
        else:
            old = pre = self.logprobs(tb, layout)
            metrics.update(logprob_agreement(tb.rollout_logprobs, pre, tb.response_mask))
        extra: dict[str, torch.Tensor] = {}
        if algo.use_kl_loss:
            extra["ref_log_prob"] = self.ref_logprobs(tb, layout)
        values = self.values(tb, layout) if self.critic is not None else None
        metrics["perf/prepass_s"] = time.perf_counter() - t0

        loss_mask = tb.response_mask
        if corr is not None and corr.decoupled:
            assert pre is not None  # resolve() refuses decoupled with old_logprobs = rollout
            weights, loss_mask, corr_metrics = corr.apply(pre, tb.rollout_logprobs, loss_mask)
            metrics.update(corr_metrics)
            if weights is not None:
                extra["rollout_is_weights"] = weights
            if float(loss_mask.sum()) == 0:
                # Everything rejected: no update, counted (the step still counts).
                metrics["update/skipped"] = 1.0
                metrics["optimizer/updates"] = float(self.updates)
                return metrics
        elif pre is not None:
            metrics.update(offpolicy_metrics(pre, tb.rollout_logprobs, tb.response_mask))

        tb.advantages, tb.returns = batching.compute_advantages(
            tb, algo.adv_estimator, self.algo_cfg, values=values
        )
        metrics.update(advantage_metrics(tb.advantages, tb.response_mask))

        several = 0 < opts.ppo_mini_batch_size < len(set(tb.group_ids))
        actor, critic = _Tally(_METRICS), _Tally(_CRITIC_METRICS)
        t0 = time.perf_counter()
        for _ in range(opts.ppo_epochs):
            shuffle = self.generator if several else None
            for trials in batching.mini_batches(tb.group_ids, opts.ppo_mini_batch_size, shuffle):
                members = set(trials)
                rows = [r for r in range(tb.num_sequences) if int(tb.seq_trial[r]) in members]
                # (rows whose every token correction rejected have nothing to normalise by)
                if not rows or float(loss_mask[rows].sum()) == 0:
                    continue
                if self.critic is not None:
                    assert values is not None and tb.returns is not None
                    both = {"values": values, "returns": tb.returns}
                    critic.add(self._train(self.critic, tb, rows, layout, loss_mask, both))
                actor.add(
                    self._train(self.group, tb, rows, layout, loss_mask, extra, old_log_probs=old)
                )
        update_s = time.perf_counter() - t0
        self.updates += len(actor.grad_norms)
        metrics.update(actor.result("actor", "update"))
        if self.critic is not None:
            metrics.update(critic.result("critic", "critic/update"))
        metrics["optimizer/updates"] = float(self.updates)
        metrics["actor/lr"] = opts.lr
        metrics["perf/update_s"] = update_s
        metrics["perf/step_s"] = time.perf_counter() - started
        return metrics

    def _train(
        self,
        group: Any,
        tb: batching.TrainBatch,
        rows: list[int],
        layout: Layout,
        loss_mask: torch.Tensor,
        extra: Mapping[str, torch.Tensor],
        *,
        old_log_probs: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """One update of ``group`` on ``rows`` (one ``train_mini_batch``); verl's metrics."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        td = to_verl(
            tb,
            rows,
            old_log_probs=old_log_probs,
            layout=layout,
            response_mask=loss_mask,
            extra=extra,
        )
        td = left_right_2_no_padding(td)
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
        return tu.get(group.train(td), "metrics")

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
        """The policy's weights as a mapping that gathers each tensor when it is read; with
        LoRA, only the adapter's matrices (a ``WeightUpdate`` of kind ``"lora"``)."""
        if self.lora is not None:
            return lora.export(self.group.engine.module, self.lora)
        return self.group.export_weights()

    def save(self, path: Path) -> None:
        checkpoint.save(self, path)

    def load(self, path: Path) -> None:
        checkpoint.load(self, path)

    def servable_weights(self, path: Path) -> Path:
        return checkpoint.servable_weights(path)


class _Tally:
    """One role's metrics over a step's updates: verl's names mapped to ours, summed over
    micro-batches (each is normalised by the whole mini-batch) and averaged over updates."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names
        self.sums: dict[str, float] = {}
        self.updates = 0
        self.grad_norms: list[float] = []

    def add(self, out: Mapping[str, Any]) -> None:
        self.updates += 1
        for theirs, ours in self.names.items():
            if theirs in out:
                value = out[theirs]
                value = sum(value) if isinstance(value, list) else value
                self.sums[ours] = self.sums.get(ours, 0.0) + float(value)
        for key, value in out.items():
            if key.startswith("rollout_corr/"):  # bypass mode: verl's loss reports them
                value = sum(value) / len(value) if isinstance(value, list) else value
                self.sums[key] = self.sums.get(key, 0.0) + float(value)
        for norm in out.get("grad_norm", []):
            if math.isfinite(float(norm)):
                self.grad_norms.append(float(norm))

    def result(self, role: str, update: str) -> dict[str, float]:
        out = {k: v / max(self.updates, 1) for k, v in self.sums.items()}
        out[f"{update}/count"] = float(self.updates)
        out[f"{update}/nonfinite_grad_skipped"] = float(self.updates - len(self.grad_norms))
        if self.grad_norms:
            out[f"{role}/grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
            out[f"{role}/grad_norm_max"] = max(self.grad_norms)
        return out


@contextlib.contextmanager
def _loading(path: str, option: str) -> Iterator[None]:
    """A model folder verl cannot read, as a one-line error naming the option."""
    try:
        yield
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"cannot load model {path!r} for the verl optimizer: {first}. Point [optimizer] "
            f"{option} at a Hugging Face model folder (config.json + weights)."
        ) from exc
