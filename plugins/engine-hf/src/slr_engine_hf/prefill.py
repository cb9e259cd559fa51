"""Prefill: the keys and values of prompts, many prompts in one forward pass.

Sessions arrive together (a rollout step starts its 32 trials at once; an agent's next
turns come back after their tool calls at about the same time). Run one at a time, each
prompt's forward pass reads all the weights for its few uncached tokens, and 32 of them
cost a round more than its first decode steps. ``prefill_rows`` runs the uncached tokens
of several prompts through one pass instead: left-padded to the longest, with per-row
position ids and an attention mask that hides the padding, so each row computes what it
would alone (up to float summation order).

A row with a cached prefix (``prefix_cache``) starts from that prefix's keys and values.
The rows of one pass feed the same number of tokens (the most any row has uncached); a row
with fewer uncached tokens feeds the last cached ones again instead of padding, which costs
the same and keeps every row one contiguous run of columns. ``plan_passes`` groups rows of
similar uncached lengths into passes so that a long prompt does not make short ones pay for
its length, and ``defer_shared`` holds back prompts that would compute again a prefix
another prompt of the same admission is about to put in the prefix cache.

The scheduler prefills a prompt's tokens but the last one: the last goes through the
batch's next decode step with every running row, whose logits give the first sampled token.
A prompt whose tokens but the last are all in the prefix cache (a repeated prompt, or a
history an earlier call already ran) then needs no prefill pass at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from slr_engine_hf.batch import KV, cache_tensors, forward_with_cache, make_cache

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: Most tokens one pass feeds (rows x the tokens each feeds) unless a single row has more:
#: bounds a pass's activations and attention scores.
PASS_TOKENS = 4096
#: What one more pass costs, in tokens fed: on CPU a pass reads every weight once (SmolLM2-135M
#: fp32, one thread: a 1-token pass ~54 ms of CPU, each more token ~2.7 ms: about 20 tokens).
PASS_COST = 20

#: One prompt to prefill: (token ids whose keys and values are wanted, the cached prefix's
#: KV or None, how many leading tokens that prefix covers).
Row = tuple[Sequence[int], KV | None, int]


@torch.inference_mode()
def prefill_rows(
    model: PreTrainedModel, rows: Sequence[Row], routing_k: int = 0
) -> list[tuple[KV, torch.Tensor | None]]:
    """One forward pass over the uncached tokens of every row (each must have at least one).

    Returns per row its keys and values for all its token ids ([1, heads, len(ids), dim]
    per layer; views of the pass's cache) and, with ``routing_k``, the expert ids of its
    uncached tokens [uncached, layers, k]. No logits: only the decoder runs."""
    if not rows:
        return []
    uncached = [len(ids) - cached for ids, _, cached in rows]
    if min(uncached) < 1:
        raise ValueError(f"prefill_rows: every row needs an uncached token, got {uncached}")
    device = next(model.parameters()).device
    width = max(uncached)  # tokens fed per row
    fed = [min(width, len(ids)) for ids, _, _ in rows]
    kept = [len(ids) - f for (ids, _, _), f in zip(rows, fed, strict=True)]  # from the cache
    past = max(kept)
    count = len(rows)
    input_ids = torch.zeros((count, width), dtype=torch.long)
    positions = torch.zeros((count, width), dtype=torch.long)
    mask = torch.zeros((count, past + width), dtype=torch.long)
    for i, ((ids, _, _), f, k) in enumerate(zip(rows, fed, kept, strict=True)):
        input_ids[i, width - f :] = torch.tensor(list(ids[k:]), dtype=torch.long)
        positions[i, width - f :] = torch.arange(k, len(ids))
        mask[i, past - k : past] = 1
        mask[i, past + width - f :] = 1
    padded = any(f != width for f in fed) or any(k != past for k in kept)
    cache = _padded_prefix(rows, kept, past) if past else DynamicCache()
    _, cache, routing = forward_with_cache(
        model,
        cache,
        routing_k,
        logits=False,
        input_ids=input_ids.to(device),
        position_ids=positions.to(device),
        attention_mask=mask.to(device) if padded else None,
        cache_position=torch.arange(past, past + width, device=device),
    )
    tensors = cache_tensors(cache)
    total = past + width
    out: list[tuple[KV, torch.Tensor | None]] = []
    for i, (ids, _, _) in enumerate(rows):
        start = total - len(ids)
        kv = [(k[i : i + 1, :, start:], v[i : i + 1, :, start:]) for k, v in tensors]
        routed = None
        if routing is not None:
            routed = routing.view(count, width, *routing.shape[1:])[i, width - uncached[i] :]
        out.append((kv, routed))
    return out


def _padded_prefix(rows: Sequence[Row], kept: Sequence[int], past: int) -> DynamicCache:
    """The rows' first ``kept`` cached tokens, right-aligned in ``past`` columns."""
    like = next(prefix for (_, prefix, _), k in zip(rows, kept, strict=True) if k)
    assert like is not None
    layers: KV = []
    for layer in range(len(like)):
        pair = []
        for which in (0, 1):
            t = like[layer][which]
            out = t.new_zeros((len(rows), t.shape[1], past, t.shape[3]))
            for i, ((_, prefix, _), k) in enumerate(zip(rows, kept, strict=True)):
                if k:
                    assert prefix is not None
                    out[i, :, past - k :] = prefix[layer][which][0, :, :k]
            pair.append(out)
        layers.append((pair[0], pair[1]))
    return make_cache(layers)


def plan_passes(uncached: Sequence[int]) -> list[list[int]]:
    """Group rows (by index) into prefill passes.

    Rows sorted by ``uncached`` tokens, cut into contiguous groups minimising the tokens fed
    (each group's rows x its longest) plus ``PASS_COST`` per pass, exactly (dynamic
    programming; 32 rows are ~500 cases). A pass feeds at most ``PASS_TOKENS`` unless it
    is one row."""
    order = sorted(range(len(uncached)), key=lambda i: uncached[i])
    lengths = [uncached[i] for i in order]
    n = len(lengths)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        longest = lengths[end - 1]  # sorted: the group's last row is its longest
        for start in range(end - 1, -1, -1):
            fed = (end - start) * longest
            if fed > PASS_TOKENS and end - start > 1:
                break
            cost = best[start] + fed + PASS_COST
            if cost < best[end]:
                best[end], cut[end] = cost, start
    passes = []
    end = n
    while end > 0:
        start = cut[end]
        passes.append(order[start:end])
        end = start
    return list(reversed(passes))


def defer_shared(prompts: Sequence[Sequence[int]], cached: Sequence[int]) -> list[bool]:
    """Which prompts should wait for the others' prefills: those that share tokens beyond
    their cached prefix (``cached``) with a prompt that goes first, when what they would
    save together is worth one more pass (``PASS_COST`` tokens). The first one's keys and
    values go into the prefix cache after its pass, and the waiting prompts reuse them a
    pass later instead of each computing them again; a prompt whose tokens but the last
    are then all cached (the same prompt twice) needs no pass at all. Waiting delays no
    first token: every pass of an admission runs before the next decode step.

    Sorted, a prompt's longest common prefix with any prompt before it is the one with its
    neighbour, so one comparison each finds them; a prompt that shares with a waiting
    neighbour waits too (a later pass finds the shared part cached all the same)."""
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    saved = [0] * len(prompts)
    for before, i in itertools.pairwise(order):
        # what the earlier one's prefill puts in the cache: its tokens but the last
        shared = min(_common_prefix(prompts[before], prompts[i]), len(prompts[before]) - 1)
        shared = min(shared, len(prompts[i]) - 1)  # what a match can reuse
        saved[i] = max(0, shared - cached[i])
    worth = sum(saved) >= PASS_COST
    return [worth and s > 0 for s in saved]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (binary search over slice comparisons, which
    run in C: a 4k-token prompt takes ~12 of them, not 4k Python steps)."""
    a, b = list(a), list(b)
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@torch.inference_mode()
def prefill(
    model: PreTrainedModel,
    token_ids: Sequence[int],
    prefix: KV | None,
    prefix_len: int,
    routing_k: int = 0,
    *,
    every_position: bool = False,
) -> tuple[torch.Tensor, KV, torch.Tensor | None]:
    """Run one sequence's uncached tokens with logits; returns the last logits [vocab]
    (with ``every_position``: the logits after each token run, [tokens, vocab]), its KV
    and, with ``routing_k``, the expert ids of the tokens run [tokens, layers, k]. Forced
    decoding scores its tokens with it."""
    device = next(model.parameters()).device
    new = list(token_ids[prefix_len:])
    input_ids = torch.tensor([new], dtype=torch.long, device=device)
    positions = torch.arange(prefix_len, len(token_ids), device=device)
    cache = (
        make_cache([(k[:, :, :prefix_len], v[:, :, :prefix_len]) for k, v in prefix])
        if (prefix is not None and prefix_len > 0)
        else DynamicCache()
    )
    logits, cache, routing = forward_with_cache(
        model,
        cache,
        routing_k,
        input_ids=input_ids,
        position_ids=positions.unsqueeze(0),
        cache_position=positions,
    )
    assert logits is not None  # asked for
    out = logits[0].float() if every_position else logits[0, -1].float()
    return out, cache_tensors(cache), routing
