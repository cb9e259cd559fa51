"""Batch assembly: trials -> padded token sequences with masks, behaviour log-probs, advantages.

Layout (one row per segment, right-padded)::

    input_ids       (B, L)    the segment's tokens, pad id 0 after its end
    attention_mask  (B, L)    1 on real tokens
    response_mask   (B, L-1)  1 where ``input_ids[:, 1:]`` is a policy token (loss_mask 1)
    rollout_logprobs(B, L-1)  the engine's behaviour log-prob of that token
    weights_versions(B, L-1)  the weights version that sampled that token (-1: unknown)
    advantages      (B, L-1)  from verl's estimator, 0 off the response mask

Column ``t`` of the shifted tensors is the prediction made from position ``t`` of the token at
``t + 1``, which is what a causal LM's logits at ``t`` score. verl's functions take
``(batch, response_length)`` tensors plus a mask; they get these shifted tensors unchanged.

Advantages are computed per *trial*, not per segment: a trial whose agent rewrote its history
has several segments, and a group baseline must count the trial once. Each trial is laid out
as one row of its policy tokens in order (every segment's, concatenated), the reward on its
last policy token, and verl's estimator runs on those rows with the group ids as ``index``.
The result is scattered back onto the segments' positions, so a trial's segments share its
advantage (and, for token-level estimators, its discounted returns run across segments).
Observation tokens are left out of the trial rows; verl's token-level estimators (gae,
reinforce_plus_plus) carry their running sums through mask-0 tokens unchanged, so removing
them does not change any result (the tests check this against the uncompacted layout).
"""

from __future__ import annotations

import inspect
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from slr.contracts import TerminationReason, TrialResult

PAD_ID = 0
UNKNOWN_VERSION = -1

STAT_KEYS = (
    "trials/total",
    "trials/excluded_infra",
    "trials/trainable",
    "trials/in_loss",
    "trials/dropped_zero_variance",
    "trials/without_policy_tokens",
    "trials/multi_segment",
    "groups/total",
    "groups/zero_variance",
    "groups/dropped_zero_variance",
    "groups/singleton",
    "tokens/unscorable",
    "batch/sequences",
    "batch/policy_tokens",
    "batch/tokens",
)


@attrs.define(kw_only=True)
class TrainBatch:
    """The assembled batch. Tensors live on the CPU until a micro-batch is moved to a device."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    weights_versions: torch.Tensor  # (B, L-1) long, -1 where unknown or not a policy token
    seq_trial: torch.Tensor  # (B,) index into ``trials``
    trials: list[TrialResult]  # the trials that made it into the loss, in row-group order
    rewards: torch.Tensor  # (T,) one per trial in ``trials``
    group_ids: list[str]  # (T,) group of each trial
    stats: dict[str, float]
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    # (B,) each row's recorded routed experts (``Segment.routed_experts``), for replay
    routing: list[Any] = attrs.Factory(list)

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_policy_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(dim=-1)


def group_key(trial: TrialResult) -> str:
    """A trial's group: ``group_id``, or its task when the loop did not set one."""
    return trial.group_id if trial.group_id is not None else f"task:{trial.task_id}"


def assemble(
    trials: Sequence[TrialResult], *, drop_zero_variance_groups: bool = True, pad_id: int = PAD_ID
) -> TrainBatch:
    """Turn trials into a padded batch (advantages not yet computed; see ``compute_advantages``).

    Infrastructure failures and trials without a reward are left out and counted; so are
    zero-variance groups (two or more trials, all rewards equal) when
    ``drop_zero_variance_groups``. Segments without policy tokens carry nothing to learn from
    and become no row; a trial with none at all still counts in its group's baseline.
    """
    # Every count is reported, zeros included, so metrics.jsonl has the same columns each step.
    stats: Counter[str] = Counter({key: 0 for key in STAT_KEYS})
    stats.update({f"termination/{reason.value}": 0 for reason in TerminationReason})
    stats["trials/total"] = len(trials)
    for trial in trials:
        stats[f"termination/{TerminationReason(trial.termination).value}"] += 1

    trainable = [t for t in trials if t.trainable]
    stats["trials/excluded_infra"] = len(trials) - len(trainable)

    groups: dict[str, list[TrialResult]] = defaultdict(list)
    for trial in trainable:
        groups[group_key(trial)].append(trial)
    stats["groups/total"] = len(groups)
    kept: list[TrialResult] = []
    for members in groups.values():
        rewards = {float(t.reward.value) for t in members}  # type: ignore[union-attr]
        if len(members) >= 2 and len(rewards) == 1:
            stats["groups/zero_variance"] += 1
            if drop_zero_variance_groups:
                stats["groups/dropped_zero_variance"] += 1
                stats["trials/dropped_zero_variance"] += len(members)
                continue
        if len(members) == 1:
            stats["groups/singleton"] += 1
        kept.extend(members)
    stats["trials/trainable"] = len(trainable)
    stats["trials/in_loss"] = len(kept)

    rows: list[tuple[int, Any]] = []  # (trial index, segment)
    for t_index, trial in enumerate(kept):
        segments = trial.trajectory.segments if trial.trajectory is not None else ()
        policy = 0
        for segment in segments:
            if segment.loss_mask and segment.loss_mask[0]:
                # Nothing precedes the first token, so no logit scores it.
                stats["tokens/unscorable"] += 1
            if sum(segment.loss_mask[1:]) == 0:
                continue
            rows.append((t_index, segment))
            policy += sum(segment.loss_mask[1:])
        if policy == 0:
            stats["trials/without_policy_tokens"] += 1
        if len(segments) > 1:
            stats["trials/multi_segment"] += 1

    max_len = max((len(seg.token_ids) for _, seg in rows), default=2)
    n = len(rows)
    input_ids = torch.full((n, max_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, max_len), dtype=torch.long)
    response_mask = torch.zeros((n, max_len - 1), dtype=torch.float32)
    rollout_logprobs = torch.zeros((n, max_len - 1), dtype=torch.float32)
    weights_versions = torch.full((n, max_len - 1), UNKNOWN_VERSION, dtype=torch.long)
    seq_trial = torch.zeros(n, dtype=torch.long)
    for i, (t_index, seg) in enumerate(rows):
        length = len(seg.token_ids)
        input_ids[i, :length] = torch.tensor(seg.token_ids, dtype=torch.long)
        attention_mask[i, :length] = 1
        response_mask[i, : length - 1] = torch.tensor(seg.loss_mask[1:], dtype=torch.float32)
        lp = torch.tensor(seg.logprobs[1:], dtype=torch.float32)
        rollout_logprobs[i, : length - 1] = lp * response_mask[i, : length - 1]
        versions = token_versions(seg, kept[t_index])
        if versions is not None:
            policy = response_mask[i, : length - 1] > 0
            row = torch.tensor(versions[1:], dtype=torch.long)
            weights_versions[i, : length - 1] = torch.where(policy, row, UNKNOWN_VERSION)
        seq_trial[i] = t_index

    stats["batch/sequences"] = n
    stats["batch/policy_tokens"] = int(response_mask.sum().item())
    stats["batch/tokens"] = int(attention_mask.sum().item())
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        rollout_logprobs=rollout_logprobs,
        weights_versions=weights_versions,
        seq_trial=seq_trial,
        trials=kept,
        rewards=torch.tensor([float(t.reward.value) for t in kept], dtype=torch.float32),  # type: ignore[union-attr]
        group_ids=[group_key(t) for t in kept],
        stats=dict(stats),
        routing=[seg.routed_experts for _, seg in rows],
    )


def token_versions(segment: Any, trial: TrialResult) -> tuple[int, ...] | None:
    """The version of each of ``segment``'s tokens: its own record, else the trial's one
    version (records written before tokens carried theirs), else None (unknown)."""
    if len(segment.weights_versions) == len(segment.token_ids):
        return tuple(segment.weights_versions)
    if trial.weights_version is not None:
        return (trial.weights_version,) * len(segment.token_ids)
    return None


def trial_positions(batch: TrainBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each trial, the (row, column) of its policy tokens in order, across its segments."""
    per_trial: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in batch.trials]
    for row in range(batch.num_sequences):
        cols = torch.nonzero(batch.response_mask[row] > 0, as_tuple=False).flatten()
        rows = torch.full_like(cols, row)
        per_trial[int(batch.seq_trial[row])].append((rows, cols))
    out = []
    for parts in per_trial:
        if parts:
            out.append((torch.cat([r for r, _ in parts]), torch.cat([c for _, c in parts])))
        else:
            empty = torch.zeros(0, dtype=torch.long)
            out.append((empty, empty))
    return out


#: What ``compute_advantages`` hands an estimator (each takes the subset it names).
PROVIDED = (
    "token_level_rewards",
    "response_mask",
    "index",
    "config",
    "norm_adv_by_std_in_grpo",
    "gamma",
    "lam",
    "values",
)


def check_estimator(estimator: str, provided: Any = PROVIDED) -> None:
    """Refuse, by name, an estimator that needs inputs this trainer does not produce."""
    from verl.trainer.ppo import core_algos

    from slr.errors import ConfigError

    fn = core_algos.get_adv_estimator_fn(estimator)
    missing = [
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        and name not in provided
    ]
    if missing:
        raise ConfigError(
            f"advantage estimator {estimator!r} needs {', '.join(missing)}, which the torch "
            f"optimizer does not provide; pick one that needs only rewards and group ids "
            f"(grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, opo, gpg) or gae"
        )


def compute_advantages(
    batch: TrainBatch,
    estimator: str,
    algo_config: Any,
    *,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, shaped like ``batch.response_mask``, from verl's estimator by name.

    ``algo_config`` is verl's ``AlgoConfig`` (gamma, lam, norm_adv_by_std_in_grpo, ...).
    ``values`` (shaped like the response mask) is required by ``gae``.
    """
    from verl.trainer.ppo import core_algos

    fn = core_algos.get_adv_estimator_fn(estimator)
    positions = trial_positions(batch)
    n_trials = len(positions)
    width = max([len(cols) for _, cols in positions] + [1])
    token_rewards = torch.zeros((n_trials, width), dtype=torch.float32)
    trial_mask = torch.zeros((n_trials, width), dtype=torch.float32)
    for k, (_, cols) in enumerate(positions):
        trial_mask[k, : len(cols)] = 1.0
        # The outcome reward sits on the trial's last policy token (column 0, masked, when the
        # trial has none, so group baselines still count it).
        token_rewards[k, max(len(cols) - 1, 0)] = batch.rewards[k]
    index = np.array(batch.group_ids, dtype=object)

    available: dict[str, Any] = {
        "token_level_rewards": token_rewards,
        "response_mask": trial_mask,
        "index": index,
        "config": algo_config,
        "norm_adv_by_std_in_grpo": algo_config.norm_adv_by_std_in_grpo,
        "gamma": algo_config.gamma,
        "lam": algo_config.lam,
    }
    if estimator == "gae":
        if values is None:
            raise ValueError("the gae estimator needs values from a value head")
        trial_values = torch.zeros((n_trials, width), dtype=torch.float32)
        for k, (rows, cols) in enumerate(positions):
            trial_values[k, : len(cols)] = values[rows, cols].float()
        available["values"] = trial_values
    params = inspect.signature(fn).parameters
    check_estimator(estimator, provided=available)
    kwargs = {name: value for name, value in available.items() if name in params}
    trial_adv, trial_ret = fn(**kwargs)

    advantages = torch.zeros_like(batch.response_mask)
    returns = torch.zeros_like(batch.response_mask)
    for k, (rows, cols) in enumerate(positions):
        advantages[rows, cols] = trial_adv[k, : len(cols)].float()
        returns[rows, cols] = trial_ret[k, : len(cols)].float()
    return advantages, returns


def mini_batches(
    group_ids: Sequence[str], size: int, generator: torch.Generator | None
) -> list[list[int]]:
    """Trial indices in mini-batches of ``size`` whole groups (0: one mini-batch of all).

    ``size`` is verl's ``ppo_mini_batch_size``: prompts, i.e. groups, per mini-batch, so a
    group's trials always share an update. Groups keep their first-seen order, shuffled with
    ``generator`` if given; the last mini-batch may hold fewer groups.
    """
    groups: dict[str, list[int]] = {}
    for index, group in enumerate(group_ids):
        groups.setdefault(group, []).append(index)
    members = list(groups.values())
    if generator is not None:
        members = [members[i] for i in torch.randperm(len(members), generator=generator).tolist()]
    size = size or len(members) or 1
    return [
        [index for group in members[k : k + size] for index in group]
        for k in range(0, len(members), size)
    ]


def micro_batches(
    rows: Sequence[int], lengths: torch.Tensor, *, max_tokens: int, max_size: int = 0
) -> list[list[int]]:
    """Pack rows into micro-batches whose padded size (rows x longest) fits ``max_tokens``.

    Rows are taken longest first, so each micro-batch pads little; a row longer than the
    budget gets a micro-batch of its own.
    """
    ordered = sorted(rows, key=lambda r: (-int(lengths[r]), r))
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for row in ordered:
        length = int(lengths[row])
        grown = max(longest, length) * (len(current) + 1)
        full = max_size and len(current) >= max_size
        if current and (grown > max_tokens or full):
            out.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, length)
    if current:
        out.append(current)
    return out
