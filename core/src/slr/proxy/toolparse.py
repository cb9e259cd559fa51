"""Tool-call syntax per model family: how tools are shown to the model, and parsed back.

A parser is chosen by ``[proxy] tool_parser``. It has two jobs:

* ``parse``: split the model's raw completion text into plain content and tool calls. A call
  that is not valid JSON of the right shape stays in the content as text, so a malformed call
  reaches the agent as words, never as a crashed request.
* the ``render_*`` methods: used only when the model's chat template has no tool support of
  its own (it never mentions ``tools``), to put the tool list into the system prompt, earlier
  calls into assistant turns and results into user turns, in the family's own syntax.

A parser may name a ``start_marker``: the text that opens a tool call. A streamed answer
holds its text back from there on (and while the text could still be its beginning), so
tool-call syntax is never streamed to the agent as content; the calls go out once parsed.
A parser whose family writes its markup in special tokens sets ``special_tokens = True``:
it then parses the completion decoded with them (the stop token included), and the content
it returns is shown to the agent with special tokens removed.

Parsers are plugins: a ``register_tool_parsers(register)`` hook names each one; the core
registers ``hermes``, slr-toolparsers-verl the families verl ships.
"""

from __future__ import annotations

import difflib
import json
import re
import uuid
from collections.abc import Sequence
from typing import Protocol

from attrs import frozen

from slr.errors import ConfigError
from slr.plugins import PluginManager, get_plugin_manager
from slr.proxy.messages import Message, Tool, ToolCall


@frozen(kw_only=True)
class Parsed:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()


class ToolParser(Protocol):
    """Reads one family's tool-call syntax. Optional attributes the proxy honours:
    ``start_marker: str`` (streaming holds text back from it) and ``special_tokens: bool``
    (parse the completion decoded with special tokens, see the module docstring)."""

    def parse(self, text: str, tools: Sequence[Tool]) -> Parsed: ...

    def render_system(self, system: str, tools: Sequence[Tool]) -> str: ...

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str: ...

    def render_results(self, results: Sequence[Message]) -> str: ...


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class HermesParser:
    """Hermes / Qwen style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

    _CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
    start_marker = "<tool_call>"
    special_tokens = False

    def parse(self, text: str, tools: Sequence[Tool]) -> Parsed:
        if not tools or "<tool_call>" not in text:
            return Parsed(content=text)
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for match in self._CALL.finditer(text):
            call = self._call(match.group(1))
            if call is None:
                continue  # malformed: leave the text where it is
            kept.append(text[pos : match.start()])
            pos = match.end()
            calls.append(call)
        kept.append(text[pos:])
        content = "".join(kept) if calls else text
        return Parsed(content=content.strip() if calls else content, tool_calls=tuple(calls))

    @staticmethod
    def _call(body: str) -> ToolCall | None:
        try:
            obj = json.loads(body.strip())
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall(id=new_call_id(), name=obj["name"], arguments=args)

    def render_system(self, system: str, tools: Sequence[Tool]) -> str:
        listing = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
        block = (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )
        return f"{system}\n\n{block}" if system else block

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        parts = [content] if content else []
        for call in calls:
            payload = json.dumps(
                {"name": call.name, "arguments": call.arguments}, ensure_ascii=False
            )
            parts.append(f"<tool_call>\n{payload}\n</tool_call>")
        return "\n".join(parts)

    def render_results(self, results: Sequence[Message]) -> str:
        return "\n".join(f"<tool_response>\n{m.content}\n</tool_response>" for m in results)


# Names people reach for that are no parser, or that mean another format than they expect.
_HINTS = {
    "qwen": 'Qwen2.5 and Qwen3 write hermes JSON calls (tool_parser = "hermes"); '
    'Qwen3-Coder and Qwen3.5 write XML calls (tool_parser = "qwen3_coder")',
    "minimax": "vLLM's \"minimax\" is MiniMax-M1's JSON format, which no installed parser "
    'reads; MiniMax-M2\'s XML calls are tool_parser = "minimax_m2"',
}


def tool_parser_names(plugins: PluginManager | None = None) -> list[str]:
    """The names ``[proxy] tool_parser`` accepts (every registered parser)."""
    return sorted((plugins or get_plugin_manager()).registry("tool_parser"))


def get_tool_parser(name: str, plugins: PluginManager | None = None) -> ToolParser:
    """Build the parser registered as ``name``; an unknown name is a ``ConfigError`` that
    lists the known ones."""
    manager = plugins or get_plugin_manager()
    registry = manager.registry("tool_parser")
    if name not in registry:
        known = ", ".join(sorted(registry))
        hint = _HINTS.get(name)
        if hint is None:
            close = difflib.get_close_matches(name, list(registry), n=1)
            hint = f"did you mean {close[0]!r}?" if close else ""
        extra = (
            ""
            if "qwen3_coder" in registry
            else (
                "; more families (qwen3_coder, glm45, kimi_k2, openai, ...): "
                "pip install slr-toolparsers-verl"
            )
        )
        raise ConfigError(
            f"proxy.tool_parser = {name!r} is not a known tool-call parser"
            f"{'; ' + hint if hint else ''}. Known: {known}{extra}"
        )
    return registry[name].create()
