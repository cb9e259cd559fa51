"""Decode attention: one query token per row over the batch's left-padded KV, without copies.

Why not transformers' ``sdpa`` path: given a padding mask (rows of unequal length always
have one), it repeats every key / value head once per query head that shares it
(``repeat_kv``, grouped-query attention) before the kernel: a copy of the whole batch's
cache, n_rep times over, per layer, per step. At 32 agent-length rows (200-2000 tokens) that
copy was ~80% of a decode step's time (torch.profiler, SmolLM2-135M, 3 query heads per key
head). It then attends every row over the full padded width, the longest row's.

``decode_attention`` serves the decode step instead: the query heads are grouped by the
key / value head they share (a view: ``[B, heads, 1, d]`` as ``[B, kv_heads, n_rep, d]``),
so the cache is read in place by two batched matmuls, and the rows are split into
**buckets** (a ``DecodePlan``: contiguous row ranges, each attending only over the columns
its longest row uses) so a short row beside a long one does not pay for the long one's
padding. The padding mask transformers builds once per forward pass still hides what is
padding inside a bucket. Everything that is not such a step (prefill, training, a model in
train mode, a call without a plan) goes to transformers' own ``sdpa`` function unchanged,
so a model shared with a trainer computes exactly what it computed before.

Numerically the same attention (fp32 scores and softmax), summed in another order:
log-probs agree with a full forward pass within float tolerance (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

#: The name this module registers with transformers' attention (and mask) interfaces.
NAME = "slr_decode"
#: The keyword argument a decode step passes its ``DecodePlan`` under, through the model's
#: forward to every attention layer (transformers forwards unknown keyword arguments).
PLAN_KWARG = "slr_decode_plan"

#: What one more bucket costs, in rows x columns of attention: ~5 small tensor ops per layer
#: (~1.5 ms a step for a 30-layer model on one CPU core) weighed against reading one cached
#: token's keys and values in every layer (~5 us for SmolLM2-135M).
BUCKET_COST = 256


@attrs.frozen
class DecodePlan:
    """Row buckets of one decode step: ``(first_row, end_row, first_column)`` each, covering
    the rows in order; a bucket attends over columns ``first_column:`` of the cache."""

    buckets: tuple[tuple[int, int, int], ...]

    @classmethod
    def for_lengths(cls, lengths: Sequence[int], width: int) -> DecodePlan:
        """Buckets for rows of ``lengths`` real tokens (this step's included), left-padded
        to ``width`` columns: contiguous row ranges minimising the attended columns plus
        ``BUCKET_COST`` per bucket (exact, by dynamic programming; 32 rows are ~500 cases)."""
        n = len(lengths)
        best = [0] + [float("inf")] * n
        cut = [0] * (n + 1)
        for end in range(1, n + 1):
            longest = 0
            for start in range(end - 1, -1, -1):
                longest = max(longest, lengths[start])
                cost = best[start] + (end - start) * longest + BUCKET_COST
                if cost < best[end]:
                    best[end], cut[end] = cost, start
        buckets = []
        end = n
        while end > 0:
            start = cut[end]
            buckets.append((start, end, width - max(lengths[start:end])))
            end = start
        return cls(tuple(reversed(buckets)))


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; see the module docstring."""
    plan: DecodePlan | None = kwargs.pop(PLAN_KWARG, None)
    if (
        plan is None
        or query.shape[2] != 1
        or module.training
        or kwargs.get("s_aux") is not None  # attention sinks: not handled here
        or (attention_mask is not None and attention_mask.dtype != torch.bool)
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scaling = kwargs.get("scaling")
    scale = scaling if scaling is not None else dim**-0.5
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = query.new_empty((batch, kv_heads, heads // kv_heads, dim))
    for start, end, column in plan.buckets:
        keys = key[start:end, :, column:]
        scores = torch.matmul(grouped[start:end], keys.transpose(-1, -2)).float() * scale
        if attention_mask is not None:
            # [rows, 1, 1, columns] (True: attend), broadcast over heads
            hidden = ~attention_mask[start:end, :, :, column:]
            scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(value.dtype)
        torch.matmul(probs, value[start:end, :, column:], out=out[start:end])
    # the layout transformers' attention functions return: [batch, 1, heads, dim]
    return out.reshape(batch, 1, heads, dim), None


AttentionInterface.register(NAME, decode_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use_decode_attention(model: Any) -> bool:
    """Serve ``model``'s decode steps with ``decode_attention`` when it runs on ``sdpa``
    (transformers' default); True when it does. Other implementations (eager, flash) are
    left as they are: the plan a step passes is then an ignored keyword argument."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(NAME)
    return True
