"""The proxy's own conversation model, shared by both APIs.

OpenAI and Anthropic requests are converted into a list of ``Message`` plus a list of
``Tool``; the renderer turns those into the chat template's input, and the accumulator
compares them (``Message.key``) to tell an extended history from a rewritten one.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from attrs import field, frozen

Role = Literal["system", "user", "assistant", "tool"]


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@frozen(kw_only=True)
class ToolCall:
    """A call the model made: ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any] = field(factory=dict)

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@frozen(kw_only=True)
class Tool:
    """A tool the agent offers: a JSON-schema function description."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(factory=dict)

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters or {"type": "object", "properties": {}},
            },
        }


@frozen(kw_only=True)
class Message:
    """One turn. ``tool_call_id`` / ``name`` only for ``role == "tool"``."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = field(default=(), converter=tuple)
    tool_call_id: str | None = None
    name: str | None = None

    def key(self) -> tuple[Any, ...]:
        """What must be equal for two messages to be "the same turn".

        Whitespace at the ends of text and tool-call ids are ignored: clients strip text
        and some rewrite ids, neither of which changes what the model saw.
        """
        calls = tuple((c.name, canonical_json(c.arguments)) for c in self.tool_calls)
        return (self.role, self.content.strip(), calls, self.name if self.role == "tool" else None)

    def as_openai(self) -> dict[str, Any]:
        """The turn as an OpenAI chat message (what chat-format SFT data holds)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json},
                }
                for c in self.tool_calls
            ]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            if self.name is not None:
                out["name"] = self.name
        return out


def tools_key(tools: tuple[Tool, ...] | list[Tool]) -> str:
    return canonical_json([[t.name, t.description, t.parameters] for t in tools])
