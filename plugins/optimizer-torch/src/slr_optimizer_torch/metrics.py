"""Step metrics that do not need the model: rewards, lengths, log-prob agreement, versions."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from slr.contracts import TrialResult
from slr_optimizer_torch.batch import TrainBatch, assemble


def _summary(prefix: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    t = torch.tensor(values, dtype=torch.float64)
    return {
        f"{prefix}/mean": float(t.mean()),
        f"{prefix}/max": float(t.max()),
        f"{prefix}/min": float(t.min()),
    }


def trial_metrics(trials: Sequence[TrialResult], *, pass_threshold: float) -> dict[str, float]:
    """Reward mean and pass rate over the trials that have a reward and may be trained on.

    Infrastructure failures are not the policy's result, so they enter neither the reward
    mean nor the pass rate (they are counted under ``termination/*`` and
    ``trials/excluded_infra``).
    """
    scored = [t for t in trials if t.trainable]
    rewards = [float(t.reward.value) for t in scored]  # type: ignore[union-attr]
    out: dict[str, float] = {}
    if rewards:
        r = torch.tensor(rewards, dtype=torch.float64)
        out["reward/mean"] = float(r.mean())
        out["reward/std"] = float(r.std()) if len(rewards) > 1 else 0.0
        out["reward/pass_rate"] = float((r >= pass_threshold).double().mean())
    lengths = [float(t.trajectory.num_policy_tokens) for t in scored if t.trajectory is not None]
    out.update(_summary("response_length", lengths))
    segments = [float(len(t.trajectory.segments)) for t in scored if t.trajectory is not None]
    out.update(_summary("segments_per_trial", segments))
    # Context management: compactions (rewrite branches) and sub-agents (fork branches).
    out.update(_summary("compactions_per_trial", [float(t.compactions) for t in scored]))
    out.update(_summary("subagents_per_trial", [float(t.subagents) for t in scored]))
    # Which policy versions produced the batch: max - min > 0 means off-policy trials.
    versions = [float(t.weights_version) for t in scored if t.weights_version is not None]
    if versions:
        out["rollout/weights_version_min"] = min(versions)
        out["rollout/weights_version_max"] = max(versions)
    return out


def logprob_agreement(
    rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How well the engine's behaviour log-probs match the trainer's, on policy tokens.

    Computed before the update, so with matching weights and log-prob definition the two
    agree to rounding (Pearson ~1, mean abs diff ~1e-6 in float32). A temperature, tokenizer,
    chat-template or weight-sync mismatch shows up here first. ``k3`` is verl's low-variance
    estimate of KL(behaviour || trainer).
    """
    select = mask > 0
    a = rollout[select].double()
    b = trainer[select].detach().double()
    if a.numel() == 0:
        return {}
    diff = (a - b).abs()
    out = {
        "rollout/logprob_abs_diff_mean": float(diff.mean()),
        "rollout/logprob_abs_diff_max": float(diff.max()),
        "rollout/k3_kl": float((torch.exp(b - a) - (b - a) - 1).mean()),
    }
    if a.numel() > 1 and float(a.std()) > 0 and float(b.std()) > 0:
        out["rollout/logprob_pearson"] = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    return out


def version_metrics(
    versions: torch.Tensor, mask: torch.Tensor, seq_trial: torch.Tensor, *, current: int
) -> dict[str, float]:
    """The weight versions that sampled the batch's policy tokens, and their age.

    ``current`` is the version of the weights being updated; a token's age is how many
    versions older the weights that sampled it are (0: on-policy). A partial weight update
    makes one trial span versions (``rollout/trials_multi_version``). Tokens of unknown
    version (-1) are counted, not aged.
    """
    policy = mask > 0
    known = policy & (versions >= 0)
    out = {"rollout/tokens_unknown_version": float((policy & ~known).sum())}
    if not bool(known.any()):
        return out
    v = versions[known]
    age = (current - v).double()
    out.update(
        {
            "rollout/token_version_min": float(v.min()),
            "rollout/token_version_max": float(v.max()),
            "rollout/token_age_mean": float(age.mean()),
            "rollout/token_age_max": float(age.max()),
            "rollout/stale_token_fraction": float((age > 0).double().mean()),
        }
    )
    spans: dict[int, set[int]] = defaultdict(set)
    for row in range(versions.shape[0]):
        spans[int(seq_trial[row])].update(versions[row][known[row]].tolist())
    out["rollout/trials_multi_version"] = float(sum(len(s) > 1 for s in spans.values()))
    return out


class Accumulator:
    """Step metrics gathered over micro-batches and updates."""

    def __init__(self) -> None:
        self.weighted: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.sums: dict[str, float] = defaultdict(float)
        self.tokens = 0
        self.micro_batches = 0
        self.updates = 0
        self.nonfinite = 0
        self.grad_norms: list[float] = []

    def add_weighted(self, values: Mapping[str, Any], weight: int) -> None:
        for key, value in values.items():
            slot = self.weighted[key]
            slot[0] += float(value) * weight
            slot[1] += weight

    def add_sum(self, key: str, value: float) -> None:
        self.sums[key] += value

    def result(self) -> dict[str, float]:
        out = {k: s / w for k, (s, w) in self.weighted.items() if w > 0}
        # Losses are normalised per mini-batch, so their micro-batch parts sum to the
        # mini-batch loss; report the mean over updates.
        out.update({k: v / max(self.updates, 1) for k, v in self.sums.items()})
        out["update/count"] = float(self.updates)
        out["update/micro_batches"] = float(self.micro_batches)
        out["update/nonfinite_grad_skipped"] = float(self.nonfinite)
        out["update/tokens"] = float(self.tokens)
        if self.grad_norms:
            out["actor/grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
            out["actor/grad_norm_max"] = max(self.grad_norms)
        return out


def open_step(
    trials: Sequence[TrialResult], options: Any, *, step: int
) -> tuple[TrainBatch, dict[str, float]]:
    """What every trainer does first in a step: the batch it trains on (``batch.assemble``)
    and the metrics it reports whether or not it updates (the trials', the batch's, the
    tokens' weight versions, ``optimizer/steps`` and ``update/skipped``). ``step`` is the
    version of the weights being updated (steps taken before this one); ``options`` has
    ``pass_threshold`` and ``drop_zero_variance_groups`` (either optimizer's config)."""
    metrics = trial_metrics(trials, pass_threshold=options.pass_threshold)
    tb = assemble(trials, drop_zero_variance_groups=options.drop_zero_variance_groups)
    metrics.update({k: float(v) for k, v in tb.stats.items()})
    metrics.update(
        version_metrics(tb.weights_versions, tb.response_mask, tb.seq_trial, current=step)
    )
    metrics["optimizer/steps"] = float(step + 1)
    # Nothing to learn from (all excluded, dropped or empty): no update, but the step
    # counts, so checkpoints and metrics stay aligned with the loop's steps.
    metrics["update/skipped"] = float(tb.num_policy_tokens == 0)
    return tb, metrics


def advantage_metrics(advantages: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """Mean, max and min of the advantages on policy tokens."""
    adv = advantages[response_mask > 0]
    return {
        "advantages/mean": float(adv.mean()),
        "advantages/max": float(adv.max()),
        "advantages/min": float(adv.min()),
    }
