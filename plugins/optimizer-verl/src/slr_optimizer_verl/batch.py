"""Trials in verl's layout: the torch optimizer's batch, re-laid as prompts + responses.

The rows, masks, behaviour log-probs, per-token versions and advantages come from
``slr_optimizer_torch.batch`` (``assemble``, ``compute_advantages``), so both trainers train
on the same numbers. verl's actor wants each row split where the policy starts::

    prompts          (B, P)   the tokens before the row's first policy token, left-padded
    responses        (B, R)   the rest of the row, right-padded (tool output included)
    input_ids        (B, P+R) prompts then responses
    attention_mask   (B, P+R) 1 on real tokens
    position_ids     (B, P+R) 0, 1, ... over the real tokens
    response_mask    (B, R)   1 on policy tokens (0 on tool output inside the response)
    rollout_log_probs(B, R)   the engine's behaviour log-prob of each response token
    advantages       (B, R)   verl's estimator's, per token
    old_log_probs    (B, R)   the ratio's denominator, when the caller has it

Response column ``k`` of row ``i`` is token ``first[i] + k``, which the torch layout's
shifted tensors (``(B, L-1)``, column ``t`` scoring token ``t + 1``) hold in column
``first[i] + k - 1``; ``Layout`` keeps those offsets and converts both ways.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch
from slr_optimizer_torch.batch import PAD_ID, TrainBatch


@attrs.frozen
class Layout:
    """Where each row of a ``TrainBatch`` splits into prompt and response."""

    first: torch.Tensor  # (B,) index of the row's first policy token (>= 1)
    length: torch.Tensor  # (B,) tokens in the row

    @classmethod
    def of(cls, tb: TrainBatch) -> Layout:
        policy = tb.response_mask > 0
        if not bool(policy.any(dim=-1).all()):
            raise ValueError(
                "every row of the batch needs a policy token (assemble drops the rest)"
            )
        first = policy.float().argmax(dim=-1) + 1  # shifted column t scores token t + 1
        return cls(first=first.long(), length=tb.lengths.long())

    @property
    def prompt_width(self) -> int:
        return int(self.first.max())

    @property
    def response_width(self) -> int:
        return int((self.length - self.first).max())

    def response(self, shifted: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """``(len(rows), R)`` response columns of a torch-layout ``(B, L-1)`` tensor."""
        width = int((self.length[list(rows)] - self.first[list(rows)]).max())
        out = torch.zeros((len(rows), width), dtype=shifted.dtype)
        for i, row in enumerate(rows):
            start, end = int(self.first[row]), int(self.length[row])
            out[i, : end - start] = shifted[row, start - 1 : end - 1]
        return out

    def shifted(self, response: torch.Tensor, rows: Sequence[int], width: int) -> torch.Tensor:
        """Back: a ``(len(rows), R)`` response tensor onto ``(len(rows), width)`` torch columns."""
        out = torch.zeros((len(rows), width), dtype=response.dtype)
        for i, row in enumerate(rows):
            start, end = int(self.first[row]), int(self.length[row])
            out[i, start - 1 : end - 1] = response[i, : end - start]
        return out


def to_verl(
    tb: TrainBatch,
    rows: Sequence[int],
    *,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    layout: Layout | None = None,
    response_mask: torch.Tensor | None = None,
    extra: Mapping[str, torch.Tensor] | None = None,
) -> Any:
    """``rows`` of ``tb`` as verl's padded ``TensorDict`` (the fields in the module doc).

    ``advantages``, ``old_log_probs``, ``response_mask`` (the loss mask: the batch's, less
    what rollout correction rejected) and each of ``extra`` (by verl's field name:
    ``ref_log_prob``, ``rollout_is_weights``, ``values``, ``returns``) are torch-layout
    ``(B, L-1)`` tensors; the batch's own advantages and response mask are used when not given.
    """
    from tensordict import TensorDict

    layout = layout or Layout.of(tb)
    rows = list(rows)
    first, length = layout.first[rows], layout.length[rows]
    prompt_w = int(first.max())
    response_w = int((length - first).max())
    n = len(rows)
    prompts = torch.full((n, prompt_w), PAD_ID, dtype=torch.long)
    responses = torch.full((n, response_w), PAD_ID, dtype=torch.long)
    attention = torch.zeros((n, prompt_w + response_w), dtype=torch.long)
    for i, row in enumerate(rows):
        f, end = int(first[i]), int(length[i])
        prompts[i, prompt_w - f :] = tb.input_ids[row, :f]
        responses[i, : end - f] = tb.input_ids[row, f:end]
        attention[i, prompt_w - f : prompt_w + end - f] = 1
    fields: dict[str, torch.Tensor] = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0),
        "response_mask": layout.response(
            tb.response_mask if response_mask is None else response_mask, rows
        ),
        "rollout_log_probs": layout.response(tb.rollout_logprobs, rows),
    }
    advantages = advantages if advantages is not None else tb.advantages
    if advantages is not None:
        fields["advantages"] = layout.response(advantages, rows)
    if old_log_probs is not None:
        fields["old_log_probs"] = layout.response(old_log_probs, rows)
    for name, tensor in (extra or {}).items():
        fields[name] = layout.response(tensor, rows)
    return TensorDict(fields, batch_size=[n])
