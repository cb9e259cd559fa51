"""Segment lineage: several live conversations in one session, and the tree they form.

The accumulator tests feed it ``Generation`` records directly; the SDK tests drive the real
proxy with the official ``openai`` client against a small untaught model, and compare what
the trajectory holds with what the engine was given and generated.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from slr.config import ProxySection
from slr.contracts import Generation, SamplingParams, Segment, Trajectory, TrialResult
from slr.contracts.serialize import from_dict, to_dict
from slr.proxy import Proxy, ProxyThread
from slr.proxy.accumulator import Accumulator, common_prefix_length
from slr.proxy.messages import Message, ToolCall
from slr.proxy.render import Renderer
from slr.proxy.toolparse import HermesParser


def common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def policy(seg) -> tuple[list[int], list[float]]:
    on = [i for i, m in enumerate(seg.loss_mask) if m]
    return [seg.token_ids[i] for i in on], [seg.logprobs[i] for i in on]


# -- the accumulator on its own --------------------------------------------------------------


@pytest.fixture(scope="module")
def renderer(smol_tokenizer):
    return Renderer(smol_tokenizer, HermesParser())


class Convo:
    """One conversation an agent holds, answered through ``acc`` with scripted replies."""

    def __init__(self, acc, tok, *messages: Message) -> None:
        self.acc, self.tok, self.messages = acc, tok, list(messages)

    def say(self, user: str, reply: str):
        self.messages.append(Message(role="user", content=user))
        prep = self.acc.prepare(self.messages, ())
        ids = [*self.tok.encode(reply, add_special_tokens=False), self.tok.eos_token_id]
        gen = Generation(
            token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", weights_version=0
        )
        seg = self.acc.commit(prep, gen, Message(role="assistant", content=reply))
        self.messages.append(Message(role="assistant", content=reply))
        return prep, seg


def test_sub_agent_and_compaction_form_a_tree(renderer, smol_tokenizer):
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    system = Message(role="system", content="You are the main agent. " * 8)
    main = Convo(acc, tok, system)
    sub = Convo(acc, tok, Message(role="system", content="You are a sub-agent."))
    main.say("Fix the bug.", "Looking.")
    for i in range(3):  # interleaved: main, sub, main, sub, ...
        sub.say(f"Search {i}", f"Found {i}.")
        main.say(f"Result {i}", f"Next {i}.")
    compacted = Convo(acc, tok, system)
    prep, _ = compacted.say("Summary: bug located. Continue.", "Patching.")
    assert prep.mode == "new" and prep.parent is acc.segments[0]
    compacted.say("ok", "Done.")
    sub.say("Last search", "Nothing.")  # the sub-agent outlives the compaction

    traj = Trajectory(session_id="s", segments=acc.segments_frozen(), num_calls=acc.calls)
    roots, fork, rewrite = traj.segments
    assert (roots.parent, fork.parent, rewrite.parent) == (None, 0, 0)
    assert (fork.branch, rewrite.branch) == ("fork", "rewrite")
    assert (traj.num_branches, traj.num_forks, traj.num_rewrites) == (2, 1, 1)
    # branch_at is the longest common token prefix with the parent: the shared system prompt
    for child in (fork, rewrite):
        assert child.branch_at == common_prefix(roots.token_ids, child.token_ids)
    system_ids = tok.encode(renderer.render([system], [], generation_prompt=False))
    assert rewrite.branch_at >= len(system_ids) - 1 > fork.branch_at


def test_rendered_prompt_that_starts_with_a_segment_extends_it(renderer, smol_tokenizer):
    """Messages that differ only where the template shows nothing still extend, by tokens."""
    tok = smol_tokenizer
    acc = Accumulator(renderer)
    call = ToolCall(id="c1", name="bash", arguments={"command": "ls"})
    convo = Convo(
        acc,
        tok,
        Message(role="user", content="List the files."),
        Message(role="assistant", content="", tool_calls=(call,)),
        Message(role="tool", content="a.txt", name="bash", tool_call_id="c1"),
    )
    convo.say("Go on.", "One file.")
    # the client sends the tool result again without its name: a different turn by the
    # message comparison, but this template does not render the name
    convo.messages[2] = Message(role="tool", content="a.txt", tool_call_id="c1")
    convo.messages.append(Message(role="user", content="And now?"))
    prep = acc.prepare(convo.messages, ())
    recorded = acc.segments[0]
    assert prep.mode == "extend" and prep.segment is recorded
    assert prep.prompt_ids[: len(recorded.ids)] == tuple(recorded.ids)
    assert len(prep.new_ids) == len(prep.prompt_ids) - len(recorded.ids)


def test_recompute_branches_at_least_after_the_reused_ids(renderer, smol_tokenizer):
    acc = Accumulator(renderer, on_rewrite="recompute")
    convo = Convo(acc, smol_tokenizer, Message(role="system", content="S"))
    convo.say("Task", "Looking.")
    convo.say("old reminder", "Done.")
    dropped = Convo(acc, smol_tokenizer, *convo.messages[:3])
    prep, seg = dropped.say("new reminder", "Yes.")
    first = acc.segments[0]
    reused = first.boundaries[0][1]
    assert prep.mode == "reuse" and seg.parent is first
    assert seg.branch_at == common_prefix(first.ids, seg.ids) >= reused


@pytest.mark.parametrize("block", [1, 3, 1024])
def test_common_prefix_across_block_edges(block):
    a = list(range(10))
    for n in range(11):
        b = (*a[:n], -1, *a[n + 1 :]) if n < 10 else tuple(a)
        assert common_prefix_length(a, b, block) == common_prefix(a, b) == n
    assert common_prefix_length(a, a[:4], block) == 4 and common_prefix_length([], a, block) == 0


def test_records_without_lineage_still_load_and_bad_lineage_is_refused():
    old = {
        "trial_id": "t",
        "task_id": "x",
        "termination": "completed",
        "trajectory": {
            "session_id": "t",
            "num_calls": 2,
            "segments": [
                {"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": [0.0, -1.0, -2.0]},
                {"token_ids": [1, 4], "loss_mask": [0, 1], "logprobs": [0.0, -0.5]},
            ],
        },
    }
    traj = from_dict(old, TrialResult).trajectory
    assert traj is not None
    assert [(s.parent, s.branch_at, s.branch) for s in traj.segments] == [(None, 0, None)] * 2
    assert (traj.num_branches, traj.num_forks, traj.num_rewrites) == (0, 0, 0)
    child = Segment(token_ids=[1, 4], loss_mask=[0, 1], logprobs=[0.0, -0.5], parent=0, branch_at=1)
    again = from_dict(
        to_dict(Trajectory(session_id="t", segments=[traj.segments[0], child])), Trajectory
    )
    assert again.segments[1].parent == 0 and again.segments[1].branch_at == 1
    with pytest.raises(ValueError, match="parent must be an earlier segment"):
        Trajectory(session_id="t", segments=[child])
    with pytest.raises(ValueError, match="no parent"):
        Segment(token_ids=[1], loss_mask=[0], logprobs=[0.0], branch_at=1)
    with pytest.raises(ValueError, match="only 2 tokens"):
        Segment(token_ids=[1, 4], loss_mask=[0, 1], logprobs=[0.0, -0.5], parent=0, branch_at=3)


# -- through the real proxy, with the openai SDK ---------------------------------------------


@pytest.fixture(scope="module")
def small_proxy(smol_tokenizer):
    """An untaught tiny model behind its own proxy: replies are a few sampled tokens."""
    from proxy_support import RecordingEngine
    from slr_engine_hf.engine import HfEngine

    from slr_testkit.tiny import tiny_model

    model, tok = tiny_model(tok=smol_tokenizer, seed=2)
    engine = RecordingEngine(HfEngine.from_model(model, tok))
    proxy = Proxy(
        engine, ProxySection(client_sampling="honor"), sampling=SamplingParams(max_tokens=6)
    )
    with ProxyThread(proxy):
        yield proxy
    asyncio.run(engine.close())


def chat(client, messages) -> None:
    r = client.chat.completions.create(model="policy", messages=messages, temperature=1.0)
    messages.append(r.choices[0].message.model_dump(exclude_none=True))


def segment_of_each_call(traj, calls) -> list:
    """Which segment holds each engine call (its prompt and generation, at their place);
    a tuple of indices where several do, None where none does."""
    found = []
    for prompt, gen in calls:
        whole = (*prompt, *gen.token_ids)
        hits = [i for i, s in enumerate(traj.segments) if s.token_ids[: len(whole)] == whole]
        found.append(hits[0] if len(hits) == 1 else tuple(hits) or None)
    return found


@pytest.mark.timeout(120)
def test_interleaved_sub_agent_calls_are_two_segments_not_one_per_call(small_proxy):
    proxy, engine = small_proxy, small_proxy.engine
    session = proxy.open_session("interleaved")
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
    main = [{"role": "system", "content": "You are the main agent."}]
    sub = [{"role": "system", "content": "You are a sub-agent: search only."}]
    for i in range(4):
        main.append({"role": "user", "content": f"main step {i}"})
        chat(client, main)
        sub.append({"role": "user", "content": f"sub step {i}"})
        chat(client, sub)
    calls = engine.of(session)
    traj = proxy.close_session(session)
    assert traj.num_calls == 8 and len(traj.segments) == 2
    assert segment_of_each_call(traj, calls) == [0, 1] * 4
    first, second = traj.segments
    assert (second.parent, second.branch) == (0, "fork")
    assert second.branch_at == common_prefix(first.token_ids, second.token_ids) > 0
    for k, seg in enumerate(traj.segments):  # exact ids and behaviour log-probs, per segment
        gens = [g for _, g in calls[k::2]]
        assert policy(seg) == (
            [t for g in gens for t in g.token_ids],
            [lp for g in gens for lp in g.logprobs],
        )


@pytest.mark.timeout(120)
def test_compaction_starts_a_child_segment_at_the_branch_point(small_proxy):
    proxy, engine = small_proxy, small_proxy.engine
    session = proxy.open_session("compaction-lineage")
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="k", max_retries=0)
    messages = [{"role": "system", "content": "You are a careful coding agent."}]
    for i in range(3):
        messages.append({"role": "user", "content": f"step {i}"})
        chat(client, messages)
        if i == 0:  # a side request between two main calls, as OpenCode's title request
            chat(client, [{"role": "system", "content": "Title:"}, messages[1]])
    compacted = [messages[0], {"role": "user", "content": "Summary: three steps done."}]
    chat(client, compacted)
    compacted.append({"role": "user", "content": "next"})
    chat(client, compacted)
    calls = engine.of(session)
    traj = proxy.close_session(session)
    assert segment_of_each_call(traj, calls) == [0, 1, 0, 0, 2, 2]
    parent, title, child = traj.segments
    assert (title.parent, title.branch) == (0, "fork")
    assert (child.parent, child.branch) == (0, "rewrite")
    assert (traj.num_branches, traj.num_rewrites, traj.num_forks) == (2, 1, 1)
    assert child.branch_at > title.branch_at
    at = child.branch_at
    assert at == common_prefix(parent.token_ids, child.token_ids)
    assert child.token_ids[:at] == parent.token_ids[:at]
    # the branch point lies after the shared system turn, inside the first user turn
    tok = engine.tokenizer
    assert tok.decode(child.token_ids[:at]).startswith(
        "<|im_start|>system\nYou are a careful coding agent.<|im_end|>\n<|im_start|>user\n"
    )
    for seg, k in ((parent, [0, 2, 3]), (title, [1]), (child, [4, 5])):
        gens = [calls[i][1] for i in k]
        assert policy(seg) == (
            [t for g in gens for t in g.token_ids],
            [lp for g in gens for lp in g.logprobs],
        )
