"""Per-session capture: the exact token ids the policy saw and generated.

A session holds segments. Each segment is one token sequence the engine was fed, grown call
by call: the prompt tokens a call added (loss mask 0, log-prob 0.0) followed by the tokens
the engine generated (mask 1, the engine's behaviour log-probs), appended verbatim.

A request *extends* a segment when its messages start with that segment's recorded messages
(the agent's earlier turns plus the replies the proxy gave). Then the segment's ids are reused
as they are, including the policy's own generated ids, and only the new messages are rendered
and tokenized: the template's end-of-turn text the model did not generate itself (for ChatML,
the newline after ``<|im_end|>``), then the new turns and the generation prompt. The engine
therefore sees, byte for byte, the prefix it saw before.

Any other request (compaction, an edited or dropped turn, a changed tool list, or a side
conversation such as a title request) starts a new segment from the whole rendered prompt,
unless that prompt's ids start with every id of a recorded segment: then it extends that one
(the engine sees the same prefix either way). With ``on_history_rewrite = "recompute"`` the
new segment still reuses the recorded ids of the longest unchanged run of leading messages,
as context (mask 0), and renders only the rest.

Segments form a tree (lineage). A new segment's parent is the recorded segment it shares the
longest token prefix with, and ``branch_at`` is that prefix's length. Whether a branch was a
fork or a rewrite is only known later, from what the agent did next: if the parent is
extended again after the branch started, two conversations were live at once (a sub-agent,
a side request); if it never is, the branch replaced it (compaction, an edited history).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from attrs import define, evolve, field, frozen

from slr.contracts import Generation, RoutedExperts, Segment
from slr.contracts.records import BranchKind
from slr.contracts.routing import merge_call
from slr.proxy.messages import Message, Tool, tools_key
from slr.proxy.render import Renderer


@define
class SegmentState:
    index: int
    tools_key: str
    messages: list[Message] = field(factory=list)
    ids: list[int] = field(factory=list)
    mask: list[int] = field(factory=list)
    logprobs: list[float] = field(factory=list)
    versions: list[int] = field(factory=list)
    # per token from the first, as the pass that first ran it routed it (None: not captured,
    # or a call came back without it, after which the segment's routing is incomplete)
    routing: RoutedExperts | None = None
    routing_lost: bool = False
    boundaries: list[tuple[int, int]] = field(factory=list)
    closing: str = ""
    calls: int = 0
    parent: SegmentState | None = None
    branch_at: int = 0
    first_call: int = 0  # the session's call numbers of this segment's first and last calls
    last_call: int = 0

    @property
    def branch(self) -> BranchKind | None:
        """How this segment left its parent, judged from what the agent did afterwards."""
        if self.parent is None:
            return None
        return "fork" if self.parent.last_call > self.first_call else "rewrite"

    def record_routing(self, routed: RoutedExperts | None) -> None:
        """Add one call's routing (it covers the call's whole prompt, from the segment's
        first token, and the tokens it generated but the last)."""
        if self.routing_lost:
            return
        if routed is None or (self.routing is not None and not self.routing.compatible(routed)):
            self.routing_lost, self.routing = True, None
            return
        self.routing = merge_call(self.routing or RoutedExperts(layers=0, top_k=0), routed)

    def freeze(self, parent: int | None = None) -> Segment:
        return Segment(
            token_ids=self.ids,
            loss_mask=self.mask,
            logprobs=self.logprobs,
            routed_experts=None if self.routing_lost else self.routing,
            weights_versions=self.versions,
            parent=parent,
            branch_at=self.branch_at if parent is not None else 0,
            branch=self.branch if parent is not None else None,
        )


@frozen(kw_only=True)
class Prepared:
    """A prompt ready for the engine, and how to record it once the engine answers."""

    prompt_ids: tuple[int, ...]
    new_ids: tuple[int, ...]  # the part of prompt_ids this call adds to the segment
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...]
    segment: SegmentState | None  # None: a new segment
    base: tuple[list[int], list[int], list[float], list[int]] | None = None  # recompute reuse
    mode: Literal["extend", "new", "reuse"] = "new"
    # a new segment's lineage: the segment it shares the longest token prefix with, and
    # that prefix's length
    parent: SegmentState | None = None
    branch_at: int = 0


class Accumulator:
    def __init__(self, renderer: Renderer, *, on_rewrite: str = "new_segment") -> None:
        self.renderer = renderer
        self.on_rewrite = on_rewrite
        self.segments: list[SegmentState] = []
        self.calls = 0

    def prepare(self, messages: Sequence[Message], tools: Sequence[Tool]) -> Prepared:
        messages, tools = tuple(messages), tuple(tools)
        tkey = tools_key(tools)
        keys = [m.key() for m in messages]
        best: SegmentState | None = None
        for seg in self.segments:
            n = len(seg.messages)
            if seg.tools_key != tkey or n == 0 or n >= len(messages):
                continue
            if [m.key() for m in seg.messages] == keys[:n] and (
                best is None or n > len(best.messages)
            ):
                best = seg
        if best is not None:
            delta = self.renderer.delta(best.messages, messages[len(best.messages) :], tools)
            if delta is not None:
                new_ids = self.renderer.encode(best.closing + delta)
                return Prepared(
                    prompt_ids=(*best.ids, *new_ids),
                    new_ids=tuple(new_ids),
                    messages=messages,
                    tools=tools,
                    segment=best,
                    mode="extend",
                )
        if self.on_rewrite == "recompute":
            reused = self._reuse(messages, tools, tkey, keys)
            if reused is not None:
                return self._with_lineage(reused)
        ids = tuple(
            self.renderer.encode(self.renderer.render(messages, tools, generation_prompt=True))
        )
        fresh = Prepared(prompt_ids=ids, new_ids=ids, messages=messages, tools=tools, segment=None)
        fresh = self._with_lineage(fresh)
        parent = fresh.parent
        if parent is not None and fresh.branch_at == len(parent.ids) < len(ids):
            # The rendered prompt starts with all of a recorded segment's ids (its messages
            # differ only in ways the template does not show): extend that one.
            return evolve(
                fresh, new_ids=ids[len(parent.ids) :], segment=parent, mode="extend", parent=None
            )
        return fresh

    def _with_lineage(self, prepared: Prepared) -> Prepared:
        """``prepared`` with the parent it would have as a new segment (if any)."""
        best: SegmentState | None = None
        best_n = 0
        for seg in self.segments:
            n = common_prefix_length(seg.ids, prepared.prompt_ids)
            # ties go to the segment used most recently: the conversation the agent was in
            if n > best_n or (n == best_n and n and best and seg.last_call > best.last_call):
                best, best_n = seg, n
        return evolve(prepared, parent=best, branch_at=best_n)

    def _reuse(self, messages, tools, tkey, keys) -> Prepared | None:
        """Longest recorded run of leading messages that ends with a policy turn, as context."""
        best: tuple[SegmentState, int, int] | None = None  # (segment, messages, ids)
        for seg in self.segments:
            if seg.tools_key != tkey:
                continue
            for n, end in reversed(seg.boundaries):
                if n < len(messages) and [m.key() for m in seg.messages[:n]] == keys[:n]:
                    if best is None or n > best[1]:
                        best = (seg, n, end)
                    break
        if best is None:
            return None
        seg, n, end = best
        delta = self.renderer.delta(seg.messages[:n], messages[n:], tools)
        if delta is None:
            return None
        closing = self.renderer.closing(seg.ids[:end])
        new_ids = self.renderer.encode(closing + delta)
        base = ([*seg.ids[:end]], [0] * end, [0.0] * end, [*seg.versions[:end]])
        return Prepared(
            prompt_ids=(*seg.ids[:end], *new_ids),
            new_ids=tuple(new_ids),
            messages=messages,
            tools=tools,
            segment=None,
            base=base,
            mode="reuse",
        )

    def commit(self, prepared: Prepared, gen: Generation, reply: Message) -> SegmentState:
        """Record one answered call. Only ever appends to a segment."""
        seg = prepared.segment
        if seg is not None and len(seg.ids) + len(prepared.new_ids) != len(prepared.prompt_ids):
            raise RuntimeError("segment changed while a call on it was in flight")
        self.calls += 1
        if seg is None:
            seg = SegmentState(
                index=len(self.segments),
                tools_key=tools_key(prepared.tools),
                parent=prepared.parent,
                branch_at=prepared.branch_at,
                first_call=self.calls,
            )
            if prepared.base is not None:
                ids, mask, lps, versions = prepared.base
                seg.ids, seg.mask, seg.logprobs, seg.versions = ids, mask, lps, versions
            self.segments.append(seg)
        n_new, n_gen = len(prepared.new_ids), len(gen.token_ids)
        seg.ids += [*prepared.new_ids, *gen.token_ids]
        seg.mask += [0] * n_new + [1] * n_gen
        seg.logprobs += [0.0] * n_new + [float(x) for x in gen.logprobs]
        # prompt tokens: the version that ran them; policy tokens: the one that sampled each
        seg.versions += [gen.weights_version] * n_new + list(gen.weights_versions)
        seg.record_routing(gen.routed_experts)
        seg.messages = [*prepared.messages, reply]
        seg.tools_key = tools_key(prepared.tools)  # a token-prefix extension may change it
        seg.boundaries.append((len(seg.messages), len(seg.ids)))
        seg.closing = self.renderer.closing(gen.token_ids)
        seg.calls += 1
        seg.last_call = self.calls
        return seg

    def segments_frozen(self) -> list[Segment]:
        """The segments as records; a parent is named by its index in this list."""
        index = {id(s): i for i, s in enumerate(self.segments)}
        return [s.freeze(None if s.parent is None else index[id(s.parent)]) for s in self.segments]


def common_prefix_length(a: Sequence[int], b: Sequence[int], block: int = 1024) -> int:
    """Length of the longest common prefix of two id sequences (block compares run in C)."""
    n = min(len(a), len(b))
    i = 0
    while i + block <= n and list(a[i : i + block]) == list(b[i : i + block]):
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i
