"""The shared-prefix KV cache: a radix tree over token ids, shared by every session.

Agent sessions repeat long prefixes: every Claude Code session starts with the same
~4k-token system prompt and tool list, and each call of a session repeats all of its
earlier turns. The tree stores the keys and values the model computed for token sequences
it has seen, split at the points where sequences diverge, so a prompt pays only for the
tokens after its longest cached prefix, whichever session computed that prefix.

Why a tree and not a per-session entry: two sessions that share a system prompt but differ
after it share one copy of the prefix's KV (an edge split at the divergence), and a new
session reuses it on its first call. The scheduler inserts a prompt's KV right after its
prefill (not only when the call finishes), and holds back prompts admitted together that
share a prefix the tree lacks until one of them has run it, so sessions that start
together compute their shared prefix once: the first one runs it, the others find it in
the tree.

Keys and values of a token depend only on the tokens before it (causal attention), so a
cached prefix gives the same logits as running it again (up to float summation order:
within 1e-4 in fp32, tested). They depend on the weights too: a weight update clears the
tree. Routed experts (MoE) are kept beside the KV of the tokens that produced them, so a
reused prefix still reports the routing of every prompt token.

Memory is bounded in tokens (``max_tokens`` over all nodes); when an insert goes over, the
least recently used leaves are evicted first (a leaf's parent becomes evictable once its
children are gone). Only the scheduler's thread touches the tree, so it has no lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from slr.contracts import RoutedExperts
from slr.contracts.routing import as_routed_experts
from slr_engine_hf.batch import KV


class _Node:
    __slots__ = ("children", "kv", "parent", "routing", "tokens", "used")

    def __init__(
        self,
        tokens: tuple[int, ...],
        kv: KV | None,
        routing: RoutedExperts | None,
        parent: _Node | None,
        used: int,
    ) -> None:
        self.tokens = tokens  # the edge from the parent: these tokens' KV is ``kv``
        self.kv = kv  # per layer (keys, values), [1, heads, len(tokens), dim]
        self.routing = routing  # per token: expert ids per MoE layer (None: not recorded)
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.used = used  # a tick of the cache's clock: least recently used goes first

    def split(self, at: int) -> _Node:
        """Cut this node's edge after ``at`` tokens; returns the new upper node."""
        assert 0 < at < len(self.tokens) and self.parent is not None and self.kv is not None
        upper = _Node(
            self.tokens[:at],
            [(k[:, :, :at], v[:, :, :at]) for k, v in self.kv],
            self.routing[:at] if self.routing is not None else None,
            self.parent,
            self.used,
        )
        self.parent.children[self.tokens[0]] = upper
        upper.children[self.tokens[at]] = self
        self.tokens = self.tokens[at:]
        self.kv = [(k[:, :, at:], v[:, :, at:]) for k, v in self.kv]
        self.routing = self.routing[at:] if self.routing is not None else None
        self.parent = upper
        return upper


class RadixPrefixCache:
    """KV for token prefixes seen before, shared across sessions (see the module docstring)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._root = _Node((), None, None, None, 0)
        self._clock = itertools.count(1)
        self.tokens = 0  # tokens held over all nodes
        # counters for stats(): lookups that reused something, tokens reused, evictions
        self.hits = 0
        self.reused_tokens = 0
        self.evicted_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def _walk(self, ids: Sequence[int]) -> tuple[list[tuple[_Node, int]], int]:
        """The path of nodes matching ``ids``: (node, tokens of its edge matched), total."""
        path: list[tuple[_Node, int]] = []
        node, n = self._root, 0
        while n < len(ids):
            child = node.children.get(ids[n])
            if child is None:
                break
            edge = child.tokens
            m = 1
            limit = min(len(edge), len(ids) - n)
            while m < limit and edge[m] == ids[n + m]:
                m += 1
            path.append((child, m))
            n += m
            if m < len(edge):
                break
            node = child
        return path, n

    def reusable(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of ``prompt`` ``match`` would reuse now; a look only (no
        hit counted, nothing marked used)."""
        if not self.enabled or len(prompt) < 2:
            return 0
        return self._walk(prompt[: len(prompt) - 1])[1]

    def match(self, prompt: Sequence[int]) -> tuple[KV | None, int, list[Any] | None]:
        """KV (and routing) of the longest cached prefix of ``prompt``, and its length.

        At least the last prompt token is always left to run (its logits are needed). The
        KV is a fresh tensor per layer: the model may extend it without touching the tree.
        """
        if not self.enabled or len(prompt) < 2:
            return None, 0, None
        path, n = self._walk(prompt[: len(prompt) - 1])
        if n == 0:
            return None, 0, None
        tick = next(self._clock)
        parts: list[KV] = []
        routing: RoutedExperts | None = RoutedExperts(layers=0, top_k=0)
        for node, m in path:
            node.used = tick
            assert node.kv is not None
            parts.append([(k[:, :, :m], v[:, :, :m]) for k, v in node.kv])
            if routing is not None and node.routing is not None:
                routing = routing + node.routing[:m]
            else:
                routing = None
        kv = [
            (
                torch.cat([p[layer][0] for p in parts], dim=2),
                torch.cat([p[layer][1] for p in parts], dim=2),
            )
            for layer in range(len(parts[0]))
        ]
        self.hits += 1
        self.reused_tokens += n
        return kv, n, routing.tolist() if routing is not None else None

    def insert(
        self, ids: Sequence[int], kv: KV, routing: list[Any] | RoutedExperts | None = None
    ) -> None:
        """Remember the KV of ``ids`` (``kv`` covers exactly those tokens, batch dim 1).

        Only the part the tree does not hold yet is stored, copied, so the caller's
        tensors (a batch row, a prefill's cache) are not kept alive by the tree.
        """
        if not self.enabled or not ids:
            return
        ids = tuple(ids[: self.max_tokens])
        path, n = self._walk(ids)
        tick = next(self._clock)
        parent = self._root
        for node, m in path:
            if m < len(node.tokens):
                node = node.split(m)
            node.used = tick
            parent = node
        if n < len(ids):
            new_routing = None
            if routing is not None and len(routing) >= len(ids):
                # kept compact: a long shared prefix of a large MoE holds millions of ids
                new_routing = as_routed_experts(routing[n : len(ids)])
            leaf = _Node(
                ids[n:],
                [(k[:, :, n : len(ids)].clone(), v[:, :, n : len(ids)].clone()) for k, v in kv],
                new_routing,
                parent,
                tick,
            )
            parent.children[ids[n]] = leaf
            self.tokens += len(leaf.tokens)
        self._evict(keep=tick)

    def _evict(self, keep: int) -> None:
        """Drop least recently used leaves until the tree fits (never what was just used,
        unless it alone is over the bound)."""
        if self.tokens <= self.max_tokens:
            return
        leaves = [n for n in self._nodes() if not n.children]
        leaves.sort(key=lambda n: n.used)
        while self.tokens > self.max_tokens and leaves:
            leaf = leaves.pop(0)
            if leaf.used == keep and any(n.used != keep for n in leaves):
                leaves.append(leaf)
                continue
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[0]]
            self.tokens -= len(leaf.tokens)
            self.evicted_tokens += len(leaf.tokens)
            if parent is not self._root and not parent.children:
                # insert in LRU order: the parent may now go too
                i = 0
                while i < len(leaves) and leaves[i].used <= parent.used:
                    i += 1
                leaves.insert(i, parent)

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def clear(self) -> None:
        """Forget everything (the weights changed, or the engine stopped)."""
        self._root = _Node((), None, None, None, 0)
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._nodes())
