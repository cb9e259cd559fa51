"""Shared by the proxy tests: the conversation, the tool, and the engine wrappers."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from slr.contracts import Generation
from slr.contracts.engine import ChunkCollector
from slr.proxy.messages import Message, Tool, ToolCall
from slr.proxy.render import Renderer
from slr.proxy.toolparse import HermesParser

SYSTEM = "You are a coding agent."
TASK = "List the files in the current directory."
TOOL_CALL_TEXT = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
TOOL_RESULT = "a.txt"
FINAL_TEXT = "The directory holds a.txt."
BASH = Tool(
    name="bash",
    description="Run a shell command",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
)
OPENAI_TOOLS = [BASH.as_openai()]
ANTHROPIC_TOOLS = [
    {"name": BASH.name, "description": BASH.description, "input_schema": BASH.parameters}
]


class RecordingEngine:
    """The real engine, with a log of every call (prompt ids in, Generation out)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[tuple[str | None, tuple[int, ...], Generation]] = []

    tokenizer = property(lambda self: self.engine.tokenizer)
    max_context = property(lambda self: self.engine.max_context)
    weights_version = property(lambda self: self.engine.weights_version)

    async def generate(self, prompt_ids: Sequence[int], sampling, *, session_id=None):
        gen = await self.engine.generate(prompt_ids, sampling, session_id=session_id)
        self.calls.append((session_id, tuple(prompt_ids), gen))
        return gen

    async def stream(self, prompt_ids: Sequence[int], sampling, *, session_id=None):
        collector = ChunkCollector()
        async with contextlib.aclosing(
            self.engine.stream(prompt_ids, sampling, session_id=session_id)
        ) as chunks:
            async for chunk in chunks:
                collector.add(chunk)
                if chunk.finish_reason is not None:  # the consumer stops at the final chunk
                    self.calls.append((session_id, tuple(prompt_ids), collector.generation()))
                yield chunk

    def of(self, session) -> list[tuple[tuple[int, ...], Generation]]:
        return [(p, g) for s, p, g in self.calls if s == session.engine_id]

    async def update_weights(self, state_dict, *, version=None, mode="drain"):
        return await self.engine.update_weights(state_dict, version=version, mode=mode)

    async def health(self):
        return await self.engine.health()

    async def close(self):
        await self.engine.close()


def tool_prompts(tok) -> list[tuple[list[int], str]]:
    """The exact prompt ids the proxy builds for the tool round-trip, with the answers."""
    r = Renderer(tok, HermesParser())
    first = [Message(role="system", content=SYSTEM), Message(role="user", content=TASK)]
    p1 = r.encode(r.render(first, [BASH], generation_prompt=True))
    call_ids = [*tok.encode(TOOL_CALL_TEXT, add_special_tokens=False), tok.eos_token_id]
    call = ToolCall(id="x", name="bash", arguments={"command": "ls"})
    history = [*first, Message(role="assistant", content="", tool_calls=[call])]
    new = [Message(role="tool", content=TOOL_RESULT, tool_call_id="x")]
    p2 = [*p1, *call_ids, *r.encode(r.closing(call_ids) + r.delta(history, new, [BASH]))]
    return [(p1, TOOL_CALL_TEXT), (p2, FINAL_TEXT)]


def teach_completions(model, tok, examples, *, steps: int = 400, lr: float = 2e-2) -> float:
    """Train ``model`` to answer each prompt with its text (+ EOS), greedily.

    Like ``slr_testkit.tiny.teach``, but the vocabulary projection runs only on the
    answer positions: ~10x less work on a busy 2-core machine.
    """
    import torch

    torch.manual_seed(0)
    rows, starts = [], []
    for prompt, text in examples:
        answer = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        rows.append([*prompt, *answer])
        starts.append(len(prompt))
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        optim.zero_grad()
        total = 0
        for row, start in zip(rows, starts, strict=True):
            ids = torch.tensor([row])
            hidden = model.model(input_ids=ids).last_hidden_state[0, start - 1 : -1]
            logits = model.lm_head(hidden)
            total = total + torch.nn.functional.cross_entropy(logits, ids[0, start:])
        loss = total / len(rows)
        loss.backward()
        optim.step()
        if loss.item() < 0.005:
            break
    model.eval()
    return float(loss.item())
