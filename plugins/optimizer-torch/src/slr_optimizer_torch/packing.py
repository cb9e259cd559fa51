"""Tree packing: rows that share a token prefix are computed once, in one packed sequence.

A long agent session becomes several segments (``slr.contracts.Segment``): a compaction
starts a new one that repeats the system prompt and tools, a sub-agent forks one off the main
conversation's prefix, and every trial of a group starts with the same task prompt. Scored as
copies, each row recomputes its whole prefix. Packed, a micro-batch's rows become one prefix
tree (a trie over their token ids): each distinct prefix is one position of a single packed
sequence, and a 4-D attention mask lets each position see exactly its ancestors, its own
prefix, with ``position_ids`` equal to its depth (its column in the row). A causal LM's output
at a position depends only on the token prefix and the positions, so every row's log-probs
are the ones its own forward would give; only the arithmetic's shape changes.

The tree needs no lineage record: sorting rows by their token ids puts each row next to the
row it shares the longest prefix with, so one comparison per row finds every shared prefix,
the proxy's recorded ``parent`` / ``branch_at`` and any plain common prefix (a group's shared
task prompt) alike.

What the loss sees does not change: log-probs are gathered back into the per-row layout
(``index``), so masks, advantages and normalisation are those of the copies layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch

#: Attention implementations known to take an explicit 4-D mask; others fall back to copies.
MASKED_ATTENTION = ("sdpa", "eager")


@attrs.frozen
class Packed:
    """One micro-batch as a prefix tree.

    ``input_ids`` and ``position_ids`` are ``(1, P)``; ``visible[i, j]`` says whether packed
    position ``i`` attends to ``j`` (``j`` is ``i`` or one of its ancestors); ``index[r, c]``
    is the packed position of token ``c`` of the micro-batch's row ``r`` (rows in the order
    they were given; 0 past a row's end, where no mask selects it).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    visible: torch.Tensor
    index: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def model_inputs(self, device: torch.device, dtype: torch.dtype, *, boolean: bool) -> dict:
        """Keyword arguments for a Hugging Face model: ids, positions and the 4-D mask.

        ``boolean`` masks (True: attend) suit sdpa; otherwise an additive float mask
        (0 or the dtype's minimum), which eager attention adds to its scores.
        """
        visible = self.visible.to(device)
        if boolean:
            mask = visible
        else:
            mask = torch.zeros(visible.shape, dtype=dtype, device=device)
            mask.masked_fill_(~visible, torch.finfo(dtype).min)
        return {
            "input_ids": self.input_ids.to(device),
            "position_ids": self.position_ids.to(device),
            "attention_mask": mask[None, None],
        }


def _rows(rows: Sequence[int], input_ids: torch.Tensor, lengths: torch.Tensor) -> dict:
    return {r: input_ids[r, : int(lengths[r])].numpy() for r in rows}


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def prefix_order(rows: Sequence[int], tokens: dict) -> list[int]:
    """``rows`` sorted by their token ids: each row then follows its longest shared prefix."""
    return sorted(rows, key=lambda r: (tuple(tokens[r].tolist()), r))


def unique_tokens(rows: Sequence[int], input_ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """Size of the prefix tree over ``rows``: the tokens a forward over it must compute."""
    tokens = _rows(rows, input_ids, lengths)
    total, prev = 0, None
    for r in prefix_order(rows, tokens):
        total += len(tokens[r]) - (0 if prev is None else _lcp(tokens[prev], tokens[r]))
        prev = r
    return total


def plan(
    rows: Sequence[int],
    input_ids: torch.Tensor,
    lengths: torch.Tensor,
    *,
    max_tokens: int,
    max_size: int = 0,
) -> list[list[int]]:
    """Micro-batches of rows whose prefix tree fits ``max_tokens`` packed positions.

    Rows are taken in prefix order, so rows that share a prefix land together; a row whose
    own length exceeds the budget travels alone (as in ``batch.micro_batches``).
    """
    tokens = _rows(rows, input_ids, lengths)
    out: list[list[int]] = []
    current: list[int] = []
    used = 0
    for r in prefix_order(rows, tokens):
        cost = len(tokens[r]) - (_lcp(tokens[current[-1]], tokens[r]) if current else 0)
        full = max_size and len(current) >= max_size
        if current and (used + cost > max_tokens or full):
            out.append(current)
            current, used = [], 0
            cost = len(tokens[r])
        current.append(r)
        used += cost
    if current:
        out.append(current)
    return out


def pack(rows: Sequence[int], input_ids: torch.Tensor, lengths: torch.Tensor) -> Packed:
    """The prefix tree of ``rows`` (rows of ``input_ids``, each ``lengths[r]`` long)."""
    tokens = _rows(rows, input_ids, lengths)
    width = max(len(t) for t in tokens.values())
    slot = {r: i for i, r in enumerate(rows)}
    index = torch.zeros((len(rows), width), dtype=torch.long)
    paths: list[np.ndarray] = []  # node ids of each row in prefix order
    node_tokens: list[np.ndarray] = []
    node_depths: list[np.ndarray] = []
    spans: list[tuple[np.ndarray, int, int]] = []  # (shared path, first new node, new count)
    size, prev = 0, None
    for r in prefix_order(rows, tokens):
        seq = tokens[r]
        shared = 0 if prev is None else _lcp(tokens[prev], seq)
        new = len(seq) - shared
        head = paths[-1][:shared] if paths else np.zeros(0, dtype=np.int64)
        path = np.concatenate([head, np.arange(size, size + new, dtype=np.int64)])
        node_tokens.append(seq[shared:])
        node_depths.append(np.arange(shared, len(seq), dtype=np.int64))
        spans.append((head, size, new))
        index[slot[r], : len(seq)] = torch.from_numpy(path)
        paths.append(path)
        size += new
        prev = r
    visible = torch.zeros((size, size), dtype=torch.bool)
    for head, first, new in spans:
        if new == 0:
            continue
        block = slice(first, first + new)
        if len(head):
            visible[block, torch.from_numpy(head)] = True
        visible[block, block] = torch.ones((new, new), dtype=torch.bool).tril()
    return Packed(
        input_ids=torch.from_numpy(np.concatenate(node_tokens)).long()[None],
        position_ids=torch.from_numpy(np.concatenate(node_depths)).long()[None],
        visible=visible,
        index=index,
    )


def unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model``'s attention cannot take a tree mask as a whole (None: it can).

    A sliding window or per-layer attention types would need one mask per layer kind; an
    attention kernel without an explicit-mask path (flash-attention) ignores the tree.
    """
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in MASKED_ATTENTION:
        return f"attention implementation {impl!r} takes no explicit 4-D mask"
    layer_types = set(getattr(config, "layer_types", None) or ())
    if layer_types - {"full_attention"}:
        return f"layer types {sorted(layer_types)} need one mask per kind"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "a sliding attention window is not expressed in the tree mask"
    return None
