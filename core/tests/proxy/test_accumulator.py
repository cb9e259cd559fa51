"""The accumulator on its own, fed Generation records as an engine would return them."""

import pytest

from slr.contracts import Generation
from slr.proxy.accumulator import Accumulator
from slr.proxy.messages import Message, Tool
from slr.proxy.render import Renderer
from slr.proxy.toolparse import HermesParser


@pytest.fixture(scope="module")
def renderer(smol_tokenizer):
    return Renderer(smol_tokenizer, HermesParser())


def gen_of(tok, ids, *, eos=True, version=0):
    ids = list(ids) + ([tok.convert_tokens_to_ids("<|im_end|>")] if eos else [])
    return Generation(
        token_ids=ids,
        logprobs=[-0.1 * (i + 1) for i in range(len(ids))],
        finish_reason="stop" if eos else "length",
        weights_version=version,
    )


def char_ids(tok, text):
    """A tokenization the tokenizer itself would never produce: one token per character."""
    return [tok.convert_tokens_to_ids(c) for c in text]


def call(acc, tok, messages, reply_ids, *, eos=True, tools=(), version=0):
    prep = acc.prepare(messages, tools)
    gen = gen_of(tok, reply_ids, eos=eos, version=version)
    text = tok.decode(reply_ids)
    seg = acc.commit(prep, gen, Message(role="assistant", content=text))
    return prep, gen, seg, text


def test_extension_reuses_the_policys_own_ids(renderer, smol_tokenizer):
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    msgs = [Message(role="system", content="Be brief."), Message(role="user", content="Say hello")]
    prep1, gen1, _, text = call(acc, tok, msgs, char_ids(tok, "Hello"))
    assert tok.encode(text, add_special_tokens=False) != list(gen1.token_ids[:-1])
    msgs += [Message(role="assistant", content=text), Message(role="user", content="Again")]
    prep2, gen2, seg, _ = call(acc, tok, msgs, tok.encode("Hello again", add_special_tokens=False))
    assert prep2.mode == "extend"
    assert prep2.prompt_ids[: len(prep1.prompt_ids) + len(gen1.token_ids)] == (
        *prep1.prompt_ids,
        *gen1.token_ids,
    )
    # what the template adds after the model's <|im_end|> is just the newline, then the turn
    assert (
        tok.decode(prep2.new_ids) == "\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
    )
    assert len(acc.segments) == 1
    frozen = seg.freeze()
    assert frozen.token_ids == (*prep2.prompt_ids, *gen2.token_ids)
    policy = [t for t, m in zip(frozen.token_ids, frozen.loss_mask, strict=True) if m]
    assert policy == [*gen1.token_ids, *gen2.token_ids]
    lps = [lp for lp, m in zip(frozen.logprobs, frozen.loss_mask, strict=True) if m]
    assert lps == [*gen1.logprobs, *gen2.logprobs]
    assert all(lp == 0.0 for lp, m in zip(frozen.logprobs, frozen.loss_mask, strict=True) if not m)


def test_extended_prompt_text_equals_a_full_render(renderer, smol_tokenizer):
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    msgs = [Message(role="user", content="One")]
    for i in range(5):
        reply = tok.encode(f"Answer {i}", add_special_tokens=False)
        prep, _, _, text = call(acc, tok, msgs, reply, eos=i % 2 == 0)
        assert tok.decode(prep.prompt_ids) == renderer.render(msgs, [], generation_prompt=True)
        msgs = [
            *msgs,
            Message(role="assistant", content=text),
            Message(role="user", content=f"Q{i}"),
        ]
    assert len(acc.segments) == 1


def test_rewrite_starts_a_new_segment(renderer, smol_tokenizer):
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    msgs = [Message(role="user", content="Task")]
    _, _, _, text = call(acc, tok, msgs, tok.encode("Working", add_special_tokens=False))
    msgs += [Message(role="assistant", content=text), Message(role="user", content="More")]
    call(acc, tok, msgs, tok.encode("Still working", add_special_tokens=False))
    compacted = [Message(role="user", content="Summary of the work so far. Continue.")]
    prep, gen, _, _ = call(acc, tok, compacted, tok.encode("OK", add_special_tokens=False))
    assert prep.mode == "new"
    assert len(acc.segments) == 2
    second = acc.segments_frozen()[1]
    assert second.token_ids == (*prep.prompt_ids, *gen.token_ids)
    assert second.loss_mask == (0,) * len(prep.prompt_ids) + (1,) * len(gen.token_ids)


def test_changed_tools_or_edited_turn_is_a_rewrite(renderer, smol_tokenizer):
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    msgs = [Message(role="user", content="Task")]
    _, _, _, text = call(acc, tok, msgs, tok.encode("Hi", add_special_tokens=False))
    later = [*msgs, Message(role="assistant", content=text), Message(role="user", content="x")]
    assert acc.prepare(later, []).mode == "extend"
    assert acc.prepare(later, [Tool(name="bash")]).mode == "new"
    edited = [
        *msgs,
        Message(role="assistant", content="Hi (edited)"),
        Message(role="user", content="x"),
    ]
    assert acc.prepare(edited, []).mode == "new"
    # whitespace at the ends of text does not count as an edit (clients strip)
    spaced = [
        *msgs,
        Message(role="assistant", content=f"  {text}\n"),
        Message(role="user", content="x"),
    ]
    assert acc.prepare(spaced, []).mode == "extend"


def test_interleaved_side_conversation_keeps_both_segments_growing(renderer, smol_tokenizer):
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    main = [Message(role="user", content="Main task")]
    side = [
        Message(role="system", content="Write a title"),
        Message(role="user", content="Main task"),
    ]
    for i in range(3):
        _, _, seg_main, text = call(
            acc, tok, main, tok.encode(f"step {i}", add_special_tokens=False)
        )
        main = [*main, Message(role="assistant", content=text), Message(role="user", content="ok")]
        _, _, seg_side, stext = call(
            acc, tok, side, tok.encode(f"title {i}", add_special_tokens=False)
        )
        side = [
            *side,
            Message(role="assistant", content=stext),
            Message(role="user", content="again"),
        ]
        assert (seg_main.index, seg_side.index) == (0, 1)
    assert len(acc.segments) == 2


def test_recompute_reuses_the_unchanged_leading_turns_as_context(renderer, smol_tokenizer):
    tok = smol_tokenizer
    acc = Accumulator(renderer, on_rewrite="recompute")
    msgs = [Message(role="user", content="Task")]
    _, _, _, t1 = call(acc, tok, msgs, char_ids(tok, "Look"))
    msgs += [Message(role="assistant", content=t1), Message(role="user", content="old reminder")]
    call(acc, tok, msgs, tok.encode("Done", add_special_tokens=False))
    dropped = [*msgs[:2], Message(role="user", content="new reminder")]
    prep, _, seg, _ = call(acc, tok, dropped, tok.encode("Yes", add_special_tokens=False))
    assert prep.mode == "reuse" and seg.index == 1
    first = acc.segments[0]
    n = first.boundaries[0][1]
    assert seg.ids[:n] == first.ids[:n]  # the policy's own ids, not a re-tokenization
    assert seg.mask[:n] == [0] * n  # context in the new segment, trained in the first one


def _routing(n: int, offset: int = 0) -> list:
    """Routing entries for ``n`` tokens: one MoE layer, experts (t, t + 1) mod 8."""
    return [[[(t + offset) % 8, (t + offset + 1) % 8]] for t in range(n)]


def test_routing_per_token_and_weights_version_per_token(renderer, smol_tokenizer):
    """Each call's routing covers its whole prompt (from the segment's first token) and the
    tokens it generated but the last; the segment keeps one entry per token, each from the
    call that first ran it (a later call's recomputed prefix does not overwrite it)."""
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    msgs = [Message(role="user", content="Task")]
    p1 = acc.prepare(msgs, [])
    out1 = [*tok.encode("Hi", add_special_tokens=False), tok.eos_token_id]
    g1 = Generation(
        token_ids=out1,
        logprobs=[-0.5] * len(out1),
        finish_reason="stop",
        weights_version=3,
        routed_experts=_routing(len(p1.prompt_ids) + len(out1) - 1),
    )
    acc.commit(p1, g1, Message(role="assistant", content="Hi"))
    msgs += [Message(role="assistant", content="Hi"), Message(role="user", content="x")]
    p2 = acc.prepare(msgs, [])
    assert p2.segment is not None  # the second call extends the first one's segment
    g2 = Generation(
        token_ids=[7, tok.eos_token_id],
        logprobs=[-0.2, -0.3],
        finish_reason="stop",
        weights_version=4,
        # a different recomputation of the prefix: only the entries past the known ones count
        routed_experts=_routing(len(p2.prompt_ids) + 1, offset=3),
    )
    seg = acc.commit(p2, g2, Message(role="assistant", content="")).freeze()
    known = len(p1.prompt_ids) + len(out1) - 1
    assert seg.routed_experts is not None
    assert len(seg.routed_experts) == len(seg.token_ids) - 1  # the last token never ran
    assert seg.routed_experts.tolist() == [
        *_routing(known),
        *_routing(len(p2.prompt_ids) + 1, offset=3)[known:],
    ]
    n1 = len(p1.prompt_ids) + len(out1)
    assert seg.weights_versions == (3,) * n1 + (4,) * (len(seg.token_ids) - n1)


def test_a_call_without_routing_leaves_the_segment_without(renderer, smol_tokenizer):
    """A replica that does not capture routing (a failover) makes the segment's routing
    incomplete: it is dropped rather than misaligned."""
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    msgs = [Message(role="user", content="Task")]
    p1 = acc.prepare(msgs, [])
    g1 = Generation(
        token_ids=[tok.eos_token_id],
        logprobs=[-0.5],
        finish_reason="stop",
        routed_experts=_routing(len(p1.prompt_ids)),
    )
    acc.commit(p1, g1, Message(role="assistant", content=""))
    msgs += [Message(role="assistant", content=""), Message(role="user", content="x")]
    p2 = acc.prepare(msgs, [])
    g2 = Generation(token_ids=[tok.eos_token_id], logprobs=[-0.2], finish_reason="stop")
    assert acc.commit(p2, g2, Message(role="assistant", content="")).freeze().routed_experts is None


def test_a_generation_spanning_two_versions_keeps_each_tokens_version(renderer, smol_tokenizer):
    """After a partial weight update a generation's tokens carry two versions; the segment
    records each policy token's own version (prompt tokens: the version that ran them)."""
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    prep = acc.prepare([Message(role="user", content="Task")], [])
    ids = [*tok.encode("Hello there", add_special_tokens=False), tok.eos_token_id]
    gen = Generation(
        token_ids=ids,
        logprobs=[-0.1] * len(ids),
        finish_reason="stop",
        weights_version=5,
        weights_versions=[5] + [6] * (len(ids) - 1),
    )
    seg = acc.commit(prep, gen, Message(role="assistant", content="Hello there")).freeze()
    n = len(prep.prompt_ids)
    assert seg.weights_versions == (5,) * n + (5,) + (6,) * (len(ids) - 1)
    assert len(seg.weights_versions) == len(seg.token_ids) == len(seg.logprobs)
