"""``TorchOptimizer``: one process, CPU or one GPU, verl's algorithms by name.

Construction::

    TorchOptimizer(options, algorithm=cfg.algorithm, temperature=cfg.rollout.temperature)
    TorchOptimizer.from_config(cfg)          # the same, from a whole run config

``options`` is this plugin's ``[optimizer]`` section (``TorchOptimizerConfig``); ``algorithm``
(the core ``[algorithm]`` section) names verl's advantage estimator and policy loss;
``temperature`` must be the rollout's, because the trainer scores tokens under the engine's
definition, ``log_softmax(logits / temperature)``. Both are required keywords so a caller
cannot silently train under a different temperature than it sampled with. ``model=`` (and
``ref_model=``) take an already-built ``nn.Module`` instead of loading ``options.model``.

One ``step(trials)``:

1. assemble the batch (``batch.py``): trainable trials only, segments as padded rows;
2. when needed, a no-grad pass for the old log-probs (several updates per step) and the
   values (gae), and one through the reference model (KL);
3. advantages from verl's estimator registry, per trial, scattered onto the segments;
4. for each epoch and mini-batch: micro-batches by token budget, verl's policy loss (plus
   verl's entropy, KL and value terms), gradients accumulated, clipped, one AdamW step.

Every forward pass (steps 2 and 4) runs a micro-batch as one prefix tree when
``options.pack == "tree"`` (``packing.py``): rows that share a token prefix compute it once,
and the scores land in the per-row layout, so nothing after the forward changes.

With ``options.use_fused_kernels`` every scorer (policy and reference) computes log-probs
and entropy through verl's fused linear-for-PPO, a chunk of positions at a time
(``model.Scorer``): the same values, without a ``tokens x vocabulary`` logits tensor.

Off-policy correction (``[algorithm.rollout_correction]``, ``correction.py``) wraps step 4
the way verl's trainer does: in decoupled mode verl's IS weights and rejection mask, from
the pre-pass log-probs vs the rollout's, enter the policy loss (the pre-pass is then always
run); in bypass mode the rollout's log-probs are the old ones and verl's ``bypass_mode``
loss applies the correction itself. Unset, the step is exactly what it was without it.

With one epoch, one mini-batch and no value head, step 2's log-prob pass is fused into the
training forward: all micro-batches run before the single parameter update, so their
log-probs are the pre-update ones (the PPO ratio's denominator and the rollout-agreement
metric both use them).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import torch
from torch import nn

from slr.config import AlgorithmSection, Config
from slr.contracts import TrialResult
from slr.errors import ConfigError
from slr_optimizer_torch import batch as batching
from slr_optimizer_torch import checkpoint, lora, packing
from slr_optimizer_torch.config import TorchOptimizerConfig
from slr_optimizer_torch.correction import offpolicy_metrics, resolve
from slr_optimizer_torch.metrics import (
    Accumulator,
    advantage_metrics,
    logprob_agreement,
    open_step,
)
from slr_optimizer_torch.model import (
    DTYPES,
    Scorer,
    Scores,
    ValueHead,
    hidden_size,
    load_causal_lm,
    resolve_device,
)
from slr_optimizer_torch.replay import RoutingReplay
from slr_optimizer_torch.verl_config import actor_config, algo_config, check_names

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = structlog.get_logger()


class TorchOptimizer:
    """The embedded trainer (``slr.contracts.Optimizer``). See the module docstring."""

    def __init__(
        self,
        options: TorchOptimizerConfig | None = None,
        *,
        algorithm: AlgorithmSection,
        temperature: float,
        model: PreTrainedModel | None = None,
        ref_model: PreTrainedModel | None = None,
    ) -> None:
        from verl.trainer.ppo import core_algos

        self.options = options = options or TorchOptimizerConfig()
        self.algorithm = algorithm
        self.temperature = float(temperature)
        check_names(algorithm)
        self.correction = resolve(algorithm, options)
        self.device = resolve_device(options.device)
        dtype = DTYPES[options.dtype]
        if model is None:
            model = load_causal_lm(options.model, dtype=dtype, device=self.device)
        # PreTrainedModel.to is wrapped in a decorator whose annotations lose the bound self.
        self.model = model.to(self.device)  # pyright: ignore[reportArgumentType]
        # lora_rank > 0: only an adapter trains (and is exported, checkpointed); lora.py
        self.lora = lora.wrap(self.model, options)
        if options.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            if self.lora is not None:  # frozen embeddings: let checkpointed blocks backprop
                self.model.enable_input_require_grads()
        self._set_mode()
        fused = options.use_fused_kernels
        self.scorer = Scorer(self.model, temperature=self.temperature, fused=fused)
        self.replay: RoutingReplay | None = None
        if algorithm.routing_replay:
            if options.gradient_checkpointing:
                raise ConfigError(
                    "routing_replay and gradient_checkpointing cannot be combined: the "
                    "checkpointed forward re-runs during backward, outside the replay. Set "
                    "[optimizer] gradient_checkpointing = false or [algorithm] "
                    "routing_replay = false"
                )
            self.replay = RoutingReplay(self.model)

        self.value_head: ValueHead | None = None
        if algorithm.adv_estimator == "gae":
            self.value_head = ValueHead(hidden_size(self.model)).to(self.device)

        self.ref_scorer: Scorer | None = None
        probed = [self.scorer]
        if algorithm.use_kl_loss:
            # a reference model that is not a copy of the policy is probed on its own
            own_ref = ref_model is not None or bool(options.ref_model)
            if ref_model is None:
                ref_model = (
                    load_causal_lm(options.ref_model, dtype=dtype, device=self.device)
                    if options.ref_model
                    else copy.deepcopy(self.model)
                )
            ref_model.to(self.device)  # pyright: ignore[reportArgumentType]  # as self.model
            ref_model = ref_model.eval().requires_grad_(False)
            self.ref_scorer = Scorer(ref_model, temperature=self.temperature, fused=fused)
            if own_ref:
                probed.append(self.ref_scorer)
        self.pack = options.pack == "tree" and self._tree_packs_exactly(probed)

        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        self.params = params
        self.optim = torch.optim.AdamW(
            params,
            lr=options.lr,
            betas=(options.betas[0], options.betas[1]),
            eps=options.eps,
            weight_decay=options.weight_decay,
        )
        self.actor_cfg = actor_config(algorithm, options, self.correction)
        self.algo_cfg = algo_config(algorithm)
        # verl annotates the registered losses as positional; they are called by keyword.
        self.policy_loss_fn: Callable[..., Any] = core_algos.get_policy_loss_fn(
            self.actor_cfg.policy_loss.loss_mode
        )
        self.generator = torch.Generator().manual_seed(options.seed)
        self.steps = 0  # step() calls
        self.updates = 0  # parameter updates applied

    @staticmethod
    def _tree_packs_exactly(scorers: Sequence[Scorer]) -> bool:
        """Whether every model the step runs passes the tree-packing probe (logged if not)."""
        for scorer in scorers:
            problem = scorer.tree_packing_problem()
            if problem is not None:
                log.warning("optimizer.pack.fallback", pack="none", reason=problem)
                return False
        return True

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        model: PreTrainedModel | None = None,
        ref_model: PreTrainedModel | None = None,
    ) -> TorchOptimizer:
        """Build from a whole run config; the model defaults to the engine's (``[engine] model``)."""
        options = config.optimizer.options or TorchOptimizerConfig()
        if not options.model and model is None:
            engine_model = getattr(config.engine.options, "model", "") or ""
            options = attrs.evolve(options, model=str(engine_model))
        return cls(
            options,
            algorithm=config.algorithm,
            temperature=config.rollout.temperature,
            model=model,
            ref_model=ref_model,
        )

    def _set_mode(self) -> None:
        # Dropout would make the recomputed log-probs disagree with the engine's; HF models
        # only checkpoint activations in train mode, so that option needs train() (and then
        # the model's dropout rates should be 0, as they are for current LMs).
        self.model.train(self.options.gradient_checkpointing)

    # -- the step ------------------------------------------------------------------------

    def step(self, batch: Sequence[TrialResult]) -> dict[str, float]:
        started = time.perf_counter()
        opts, algo = self.options, self.algorithm
        # The weights being updated are version `steps` (the loop: after step N, version N).
        tb, metrics = open_step(batch, opts, step=self.steps)
        # What one forward pass over the batch must compute at least (its prefix tree), and
        # whether this trainer packs it so (update/tokens: what the update computed).
        metrics["batch/unique_tokens"] = float(
            packing.unique_tokens(range(tb.num_sequences), tb.input_ids, tb.lengths)
        )
        metrics["pack/tree"] = float(self.pack)
        if self.replay is not None:
            # rows trained on the trainer's own routing: no routing was recorded for them
            metrics["routing_replay/rows_unrecorded"] = float(sum(r is None for r in tb.routing))
            self.replay.replayed = self.replay.changed = 0
        self.steps += 1
        if tb.num_policy_tokens == 0:
            metrics["optimizer/updates"] = float(self.updates)
            return metrics

        corr = self.correction
        decoupled = corr is not None and corr.decoupled
        bypass = corr is not None and corr.bypass
        # More than one update per epoch (ppo_mini_batch_size smaller than the groups)?
        several = 0 < opts.ppo_mini_batch_size < len(set(tb.group_ids))
        # Decoupled correction weighs the whole batch by pi_old before any update: verl
        # computes pi_old in its own pass, and so does this trainer then.
        fused = opts.ppo_epochs == 1 and not several and self.value_head is None and not decoupled
        t0 = time.perf_counter()
        pre: Scores | None = None
        if not fused:
            pre = self._score_all(tb, self.scorer, value_head=self.value_head)
            metrics.update(logprob_agreement(tb.rollout_logprobs, pre.logprobs, tb.response_mask))
        ref_logprobs = (
            self._score_all(tb, self.ref_scorer, entropy=False).logprobs
            if self.ref_scorer is not None
            else None
        )
        metrics["perf/prepass_s"] = time.perf_counter() - t0

        loss_mask, is_weights = tb.response_mask, None
        if decoupled:
            assert corr is not None and pre is not None
            is_weights, loss_mask, corr_metrics = corr.apply(
                pre.logprobs, tb.rollout_logprobs, tb.response_mask
            )
            metrics.update(corr_metrics)
            if float(loss_mask.sum()) == 0:
                # Everything rejected: no update, counted (the step still counts).
                metrics["update/skipped"] = 1.0
                metrics["optimizer/updates"] = float(self.updates)
                return metrics
        elif pre is not None and not bypass:
            metrics.update(offpolicy_metrics(pre.logprobs, tb.rollout_logprobs, tb.response_mask))

        values = pre.values if pre is not None else None
        tb.advantages, tb.returns = batching.compute_advantages(
            tb, algo.adv_estimator, self.algo_cfg, values=values
        )
        metrics.update(advantage_metrics(tb.advantages, tb.response_mask))

        if opts.old_logprobs == "rollout" or bypass:
            old = tb.rollout_logprobs
        else:
            old = pre.logprobs if pre is not None else None  # fused: the forward's own

        acc = Accumulator()
        fused_logprobs = torch.zeros_like(tb.response_mask) if fused else None
        t0 = time.perf_counter()
        for _ in range(opts.ppo_epochs):
            shuffle = self.generator if several else None
            for trials in batching.mini_batches(tb.group_ids, opts.ppo_mini_batch_size, shuffle):
                members = set(trials)
                rows = [r for r in range(tb.num_sequences) if int(tb.seq_trial[r]) in members]
                # (rows whose every token correction rejected have nothing to normalise by)
                if rows and float(loss_mask[rows].sum()) > 0:
                    self._update(
                        tb,
                        rows,
                        old,
                        ref_logprobs,
                        values,
                        acc,
                        fused_logprobs,
                        loss_mask=loss_mask,
                        is_weights=is_weights,
                    )
        update_s = time.perf_counter() - t0
        if fused_logprobs is not None:
            metrics.update(logprob_agreement(tb.rollout_logprobs, fused_logprobs, tb.response_mask))
            if not bypass:  # bypass: verl's loss reports them, from the evolving policy
                metrics.update(
                    offpolicy_metrics(fused_logprobs, tb.rollout_logprobs, tb.response_mask)
                )

        metrics.update(acc.result())
        if self.replay is not None and self.replay.replayed:
            # token-layers whose recorded experts differ from what the trainer would choose
            metrics["routing_replay/changed_fraction"] = self.replay.changed / self.replay.replayed
        metrics["optimizer/updates"] = float(self.updates)
        metrics["actor/lr"] = float(self.optim.param_groups[0]["lr"])
        metrics["perf/update_s"] = update_s
        metrics["perf/tokens_per_s"] = acc.tokens / update_s if update_s > 0 else 0.0
        step_s = time.perf_counter() - started
        metrics["perf/step_s"] = step_s
        metrics["perf/step_tokens_per_s"] = tb.stats["batch/tokens"] * opts.ppo_epochs / step_s
        return metrics

    def _micro(
        self, tb: batching.TrainBatch, rows: Sequence[int]
    ) -> list[tuple[list[int], packing.Packed | None]]:
        """Micro-batches of ``rows``, each with its prefix tree when packing."""
        opts = self.options
        if not self.pack:
            return [
                (micro, None)
                for micro in batching.micro_batches(
                    rows,
                    tb.lengths,
                    max_tokens=opts.micro_batch_tokens,
                    max_size=opts.micro_batch_size,
                )
            ]
        micros = packing.plan(
            rows,
            tb.input_ids,
            tb.lengths,
            max_tokens=opts.micro_batch_tokens,
            max_size=opts.micro_batch_size,
        )
        return [(micro, packing.pack(micro, tb.input_ids, tb.lengths)) for micro in micros]

    @staticmethod
    def _computed(tb: batching.TrainBatch, micro: list[int], packed: packing.Packed | None) -> int:
        """Tokens the forward over ``micro`` computes (padding aside)."""
        return packed.tokens if packed is not None else int(tb.lengths[micro].sum())

    def _replaying(
        self,
        tb: batching.TrainBatch,
        micro: Sequence[int],
        length: int,
        packed: packing.Packed | None,
        policy: bool = True,
    ) -> AbstractContextManager[None]:
        """Around a policy forward over ``micro``: the rollout's routing, when replayed."""
        if self.replay is None or not policy:
            return nullcontext()
        experts, valid = self.replay.layout([tb.routing[r] for r in micro], length, packed)
        return self.replay.use(experts.to(self.device), valid.to(self.device))

    def _slice(self, tensor: torch.Tensor, micro: Sequence[int], width: int) -> torch.Tensor:
        return tensor[micro, :width].to(self.device, non_blocking=True)

    @torch.no_grad()
    def _score_all(
        self,
        tb: batching.TrainBatch,
        scorer: Scorer | None,
        *,
        entropy: bool = False,
        value_head: nn.Module | None = None,
    ) -> Scores:
        assert scorer is not None
        logprobs = torch.zeros_like(tb.response_mask)
        values = torch.zeros_like(tb.response_mask) if value_head is not None else None
        for micro, packed in self._micro(tb, range(tb.num_sequences)):
            length = int(tb.lengths[micro].max())
            with self._replaying(tb, micro, length, packed, scorer is self.scorer):
                s = scorer(
                    self._slice(tb.input_ids, micro, length),
                    self._slice(tb.attention_mask, micro, length),
                    self._slice(tb.response_mask, micro, length - 1),
                    entropy=entropy,
                    value_head=value_head,
                    packed=packed,
                )
            logprobs[micro, : length - 1] = s.logprobs.float().cpu()
            if values is not None and s.values is not None:
                values[micro, : length - 1] = s.values.float().cpu()
        return Scores(logprobs=logprobs, values=values)

    def _update(
        self,
        tb: batching.TrainBatch,
        rows: list[int],
        old: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        values: torch.Tensor | None,
        acc: Accumulator,
        fused_logprobs: torch.Tensor | None,
        *,
        loss_mask: torch.Tensor,
        is_weights: torch.Tensor | None = None,
    ) -> None:
        """One parameter update on ``rows``: accumulate micro-batch gradients, clip, step.

        ``loss_mask`` is the response mask less the tokens off-policy correction rejected
        (the response mask itself without correction); ``is_weights`` are verl's IS weights.
        """
        from verl.trainer.ppo.core_algos import agg_loss, compute_value_loss, kl_penalty

        algo, opts = self.algorithm, self.options
        mode = algo.loss_agg_mode
        resp = loss_mask[rows]
        widest = int(tb.lengths[rows].max()) - 1
        # verl normalises each micro-batch's loss by the whole mini-batch, so the accumulated
        # gradient does not depend on how the mini-batch was split (as in its FSDP actor).
        info = {
            "dp_size": 1,
            "batch_num_tokens": int(resp.sum().item()),
            "global_batch_size": int((resp.sum(dim=-1) > 0).sum().item()),
            "loss_scale_factor": algo.loss_scale_factor or widest,
        }
        self.actor_cfg.global_batch_info.clear()
        self.actor_cfg.global_batch_info.update(info)
        self.optim.zero_grad(set_to_none=True)
        assert tb.advantages is not None  # computed by step() before the update
        for micro, packed in self._micro(tb, rows):
            length = int(tb.lengths[micro].max())
            width = length - 1
            policy = self._slice(tb.response_mask, micro, width)
            mask = self._slice(loss_mask, micro, width) > 0
            with self._replaying(tb, micro, length, packed):
                scores = self.scorer(
                    self._slice(tb.input_ids, micro, length),
                    self._slice(tb.attention_mask, micro, length),
                    policy,
                    entropy=True,
                    entropy_grad=algo.entropy_coeff > 0,
                    value_head=self.value_head,
                    packed=packed,
                )
            logprobs = scores.logprobs
            if fused_logprobs is not None:
                fused_logprobs[micro, :width] = logprobs.detach().float().cpu()
            old_mb = logprobs.detach() if old is None else self._slice(old, micro, width)
            pg_loss, pg_metrics = self.policy_loss_fn(
                old_log_prob=old_mb,
                log_prob=logprobs,
                advantages=self._slice(tb.advantages, micro, width),
                response_mask=mask,
                loss_agg_mode=mode,
                config=self.actor_cfg,
                rollout_is_weights=(
                    None if is_weights is None else self._slice(is_weights, micro, width)
                ),
            )
            loss = pg_loss
            n_tokens = int(mask.sum().item())
            if n_tokens:  # every token of this micro-batch rejected: no means to take
                acc.add_weighted(pg_metrics, n_tokens)
            acc.add_sum("actor/pg_loss", float(pg_loss.detach()))
            assert scores.entropy is not None
            entropy_loss = agg_loss(
                loss_mat=scores.entropy, loss_mask=mask, loss_agg_mode=mode, **info
            )
            if algo.entropy_coeff > 0:
                loss = loss - algo.entropy_coeff * entropy_loss
            if n_tokens:
                acc.add_weighted(
                    {"actor/entropy": float(scores.entropy[mask].detach().mean())}, n_tokens
                )
            if ref_logprobs is not None:
                # verl annotates torch.FloatTensor, which torch's stubs never return.
                kld = kl_penalty(
                    logprob=logprobs,  # pyright: ignore[reportArgumentType]
                    ref_logprob=self._slice(ref_logprobs, micro, width),  # pyright: ignore[reportArgumentType]
                    kl_penalty=algo.kl_loss_type,
                )
                kl_loss = agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=mode, **info)
                loss = loss + algo.kl_loss_coef * kl_loss
                acc.add_sum("actor/kl_loss", float(kl_loss.detach()))
                if n_tokens:
                    acc.add_weighted({"actor/kl_ref": float(kld[mask].detach().mean())}, n_tokens)
            if self.value_head is not None:
                assert values is not None and tb.returns is not None
                assert scores.values is not None  # scored with the value head
                vf_loss, vf_clipfrac = compute_value_loss(
                    vpreds=scores.values,
                    returns=self._slice(tb.returns, micro, width),
                    values=self._slice(values, micro, width),
                    response_mask=mask,
                    cliprange_value=opts.cliprange_value,
                    loss_agg_mode=mode,
                    **info,
                )
                loss = loss + opts.value_coef * vf_loss
                acc.add_sum("critic/vf_loss", float(vf_loss.detach()))
                acc.add_weighted({"critic/vf_clipfrac": float(vf_clipfrac)}, n_tokens)
            loss.backward()
            acc.tokens += self._computed(tb, micro, packed)
            acc.micro_batches += 1

        limit = opts.clip_grad if opts.clip_grad > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, limit))
        acc.updates += 1
        if math.isfinite(grad_norm):
            self.optim.step()
            self.updates += 1
            acc.grad_norms.append(grad_norm)
        else:
            acc.nonfinite += 1
        self.optim.zero_grad(set_to_none=True)

    # -- weights and checkpoints ---------------------------------------------------------

    def export_weights(self) -> Mapping[str, torch.Tensor]:
        """The policy's state dict, copied to the CPU (for ``Engine.update_weights``); with
        LoRA, only the adapter's matrices (a ``WeightUpdate`` of kind ``"lora"``)."""
        if self.lora is not None:
            return lora.export(self.model, self.lora)
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def save(self, path: Path) -> None:
        """Write this optimizer's files into a checkpoint folder (see ``checkpoint.py``)."""
        checkpoint.save(self, path)

    def load(self, path: Path) -> None:
        """Restore exactly what ``save`` wrote (refuses a checkpoint without ``COMPLETE``)."""
        checkpoint.load(self, path)

    def servable_weights(self, path: Path) -> Path:
        """The Hugging Face model folder (``policy/``) inside a checkpoint."""
        return checkpoint.servable_weights(path)
