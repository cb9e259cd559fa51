"""A batch split over the ranks of a worker group the way verl's trainer splits it.

verl's dispatch (``make_nd_compute_dataproto_dispatch_fn``) cuts a batch into as many
contiguous, equal chunks as there are data-parallel ranks; its PPO trainer first reorders
the rows so each chunk carries about the same work (``RayPPOTrainer._balance_batch``:
``calculate_workload`` of each row's length, ``get_seqlen_balanced_partitions`` with equal
sizes). ``for_ranks`` does the same with verl's two functions, on the no-padding
``TensorDict`` the worker takes, and two things verl's trainer does not need:

- a batch whose rows do not divide by the ranks gets **filler rows**: copies of its
  shortest rows with ``response_mask`` / ``loss_mask`` zeroed, so they add no token to the
  loss, to ``batch_num_tokens`` or to the gradient (verl's trainer sizes its batches to
  divide; trials do not);
- ``keep``, where each original row went, so outputs (log-probs) come back in the caller's
  order without the fillers.
"""

from __future__ import annotations

from typing import Any

import torch

#: Per-token masks a filler row gets zeroed (as verl names them).
MASKS = ("response_mask", "loss_mask")


def row_lengths(td: Any) -> torch.Tensor:
    """Tokens in each row of a no-padding batch (``input_ids`` is a jagged tensor)."""
    ids = td["input_ids"]
    if not ids.is_nested:
        raise ValueError("for_ranks takes verl's no-padding batch (left_right_2_no_padding)")
    return ids.offsets().diff()


def plan(lengths: list[int], ranks: int) -> tuple[list[int], list[bool]]:
    """Which original row fills each slot of the split batch, and which slots are fillers.

    Slots ``[k * n / ranks, (k + 1) * n / ranks)`` go to rank ``k``; the rows are spread with
    verl's balanced partitioning, so each rank's workload is about the same."""
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

    n = len(lengths)
    if n == 0:
        raise ValueError("an empty batch cannot be split over ranks")
    by_length = sorted(range(n), key=lambda i: (lengths[i], i))
    extra = (-n) % ranks
    source = list(range(n)) + [by_length[k % n] for k in range(extra)]
    work = calculate_workload(torch.tensor([lengths[i] for i in source], dtype=torch.long))
    found: Any = get_seqlen_balanced_partitions(work.tolist(), k_partitions=ranks, equal_size=True)
    parts: list[list[int]] = found
    slots = [j for part in parts for j in sorted(part)]
    return [source[j] for j in slots], [j >= n for j in slots]


def for_ranks(td: Any, ranks: int) -> tuple[Any, torch.Tensor]:
    """``td`` reordered (and filled) for ``ranks`` equal chunks, and ``keep``: the slot of
    each original row, in the original order (``index_select`` it out of the outputs)."""
    from verl.utils import tensordict_utils as tu

    rows, filler = plan(row_lengths(td).tolist(), ranks)
    out = tu.index_select_tensor_dict(td, rows)
    fill = torch.tensor(filler, dtype=torch.bool)
    if bool(fill.any()):
        for key in MASKS:
            if key in out.keys():
                mask = out[key]
                if mask.is_nested:
                    raise ValueError(f"{key} is a jagged tensor; filler rows need it padded")
                mask[fill] = 0
    keep = torch.empty(len(td), dtype=torch.long)
    for slot, (row, is_filler) in enumerate(zip(rows, filler, strict=True)):
        if not is_filler:
            keep[row] = slot
    return out, keep
