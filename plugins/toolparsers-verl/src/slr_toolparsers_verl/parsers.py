"""verl's tool-call parsers behind slr's ``ToolParser`` interface.

verl's parsers (``verl.experimental.agent_loop.tool_parser.ToolParser``) take the generated
token ids and a tokenizer, decode, and extract calls in a coroutine. The proxy has the text
already (decoded once, with special tokens where the family needs them), so the adapter
hands verl a tokenizer whose ``decode`` returns its input, and runs verl's coroutine on a
private event loop thread (the proxy's ``parse`` is synchronous and runs on the proxy's loop).

What the adapter adds to verl's behaviour, so every parser acts as slr's hermes parser does:

* a reply in which any call did not parse (fewer calls than the family's per-call marker
  appears, arguments that are not a JSON object) yields no calls: the whole text reaches the
  agent as words, instead of the malformed call being dropped silently;
* ``render_calls`` / ``render_system`` / ``render_results`` for templates without tool support
  (each family's own call syntax; verl has no renderer).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from attrs import frozen

from slr.proxy.messages import Message, Tool, ToolCall
from slr.proxy.toolparse import Parsed, new_call_id

_TIMEOUT_S = 30.0


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _qwen3_coder(call: ToolCall) -> str:
    params = "".join(
        f"<parameter={k}>\n{_value_text(v)}\n</parameter>\n" for k, v in call.arguments.items()
    )
    return f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>"


def _glm45(call: ToolCall) -> str:
    args = "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{_value_text(v)}</arg_value>\n"
        for k, v in call.arguments.items()
    )
    return f"<tool_call>{call.name}\n{args}</tool_call>"


def _glm47(call: ToolCall) -> str:
    args = "".join(
        f"<arg_key>{k}</arg_key><arg_value>{_value_text(v)}</arg_value>"
        for k, v in call.arguments.items()
    )
    return f"<tool_call>{call.name}{args}</tool_call>"


def _kimi_k2(call: ToolCall) -> str:
    args = json.dumps(call.arguments, ensure_ascii=False)
    return (
        "<|tool_calls_section_begin|><|tool_call_begin|>"
        f"functions.{call.name}:0<|tool_call_argument_begin|>{args}"
        "<|tool_call_end|><|tool_calls_section_end|>"
    )


def _openai(call: ToolCall) -> str:
    args = json.dumps(call.arguments, ensure_ascii=False)
    return (
        f"<|start|>assistant<|channel|>commentary to=functions.{call.name} "
        f"<|constrain|>json<|message|>{args}<|call|>"
    )


def _minimax_m2(call: ToolCall) -> str:
    params = "".join(
        f'<parameter name="{k}">{_value_text(v)}</parameter>\n' for k, v in call.arguments.items()
    )
    return (
        f'<minimax:tool_call>\n<invoke name="{call.name}">\n{params}</invoke>\n</minimax:tool_call>'
    )


def _seed_oss(call: ToolCall) -> str:
    params = "".join(
        f"<parameter={k}>{_value_text(v)}</parameter>\n" for k, v in call.arguments.items()
    )
    return f"<seed:tool_call>\n<function={call.name}>\n{params}</function>\n</seed:tool_call>"


_DSML = "｜DSML｜"


def _deepseek_v4(call: ToolCall) -> str:
    params = "".join(
        f'<{_DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f"{_value_text(v)}</{_DSML}parameter>\n"
        for k, v in call.arguments.items()
    )
    return (
        f'<{_DSML}tool_calls>\n<{_DSML}invoke name="{call.name}">\n{params}'
        f"</{_DSML}invoke>\n</{_DSML}tool_calls>"
    )


def _gemma4(call: ToolCall) -> str:
    def value(v: Any) -> str:
        return f'<|"|>{v}<|"|>' if isinstance(v, str) else json.dumps(v)

    args = ",".join(f"{k}:{value(v)}" for k, v in call.arguments.items())
    return f"<|tool_call>call:{call.name}{{{args}}}<tool_call|>"


_HARMONY_FINAL = re.compile(
    r"<\|channel\|>final<\|message\|>(.*?)(?:<\|return\|>|<\|end\|>|$)", re.S
)


def _harmony_content(text: str) -> str:
    """gpt-oss: what the user sees is the ``final`` channel; analysis is not content."""
    found = _HARMONY_FINAL.findall(text)
    return "".join(found) if found else text


@frozen(kw_only=True)
class Family:
    """One model family: verl's parser for it and the markers slr needs around it."""

    verl_name: str
    start_marker: str  # opens the tool calls (streaming holds text back from here)
    call_marker: str  # opens each call (counted to notice a call verl dropped) ...
    end_marker: str  # ... and closes it (verl reads some unclosed calls; slr does not)
    special_tokens: bool  # the markup is in special tokens: parse with them kept
    render: Callable[[ToolCall], str]
    prefix: str = ""  # what the generation prompt already wrote, which verl's pattern expects
    stop_markers: tuple[str, ...] = ()  # tokens after which the family keeps generating
    content: Callable[[str], str] | None = None  # the user-visible part of verl's content


FAMILIES: dict[str, Family] = {
    "qwen3_coder": Family(
        verl_name="qwen3_coder",
        start_marker="<tool_call>",
        call_marker="<function=",
        end_marker="</function>",
        special_tokens=False,
        render=_qwen3_coder,
    ),
    "glm45": Family(
        verl_name="glm",
        start_marker="<tool_call>",
        call_marker="<tool_call>",
        end_marker="</tool_call>",
        special_tokens=True,
        render=_glm45,
    ),
    "glm47": Family(
        verl_name="glm",
        start_marker="<tool_call>",
        call_marker="<tool_call>",
        end_marker="</tool_call>",
        special_tokens=True,
        render=_glm47,
    ),
    "kimi_k2": Family(
        verl_name="kimi",
        start_marker="<|tool_calls_section_begin|>",
        call_marker="<|tool_call_begin|>",
        end_marker="<|tool_call_end|>",
        special_tokens=True,
        render=_kimi_k2,
    ),
    "openai": Family(
        verl_name="gpt-oss",
        start_marker="<|channel|>",
        call_marker=" to=functions.",
        end_marker="<|call|>",
        special_tokens=True,
        render=_openai,
        prefix="<|start|>assistant",
        content=_harmony_content,
    ),
    "minimax_m2": Family(
        verl_name="minimax",
        start_marker="<minimax:tool_call>",
        call_marker="<invoke name=",
        end_marker="</invoke>",
        special_tokens=True,
        render=_minimax_m2,
    ),
    "seed_oss": Family(
        verl_name="seed",
        start_marker="<seed:tool_call>",
        call_marker="<seed:tool_call>",
        end_marker="</seed:tool_call>",
        special_tokens=True,
        render=_seed_oss,
    ),
    "deepseek_v4": Family(
        verl_name="deepseek_v4",
        start_marker=f"<{_DSML}tool_calls>",
        call_marker=f"<{_DSML}invoke name=",
        end_marker=f"</{_DSML}invoke>",
        special_tokens=True,
        render=_deepseek_v4,
    ),
    "gemma4": Family(
        verl_name="gemma4",
        start_marker="<|tool_call>",
        call_marker="<|tool_call>",
        end_marker="<tool_call|>",
        special_tokens=True,
        render=_gemma4,
        stop_markers=("<tool_call|>",),
    ),
}
FAMILIES["qwen3_xml"] = FAMILIES["qwen3_coder"]  # vLLM's second name for the same format


class _TextTokenizer:
    """What verl's parsers ask of a tokenizer, for text that is already decoded."""

    pad_token = ""  # removed from the text by some parsers: empty removes nothing

    def decode(self, text: str, skip_special_tokens: bool = False) -> str:
        return text

    def convert_tokens_to_ids(self, token: str) -> int:
        return -1


class _Loop:
    """One event loop on a daemon thread for verl's coroutines (started on first use)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, Any]) -> Any:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="slr-verl-toolparse", daemon=True
                ).start()
                cls._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, cls._loop).result(timeout=_TIMEOUT_S)


def _verl_tools(tools: Sequence[Tool]) -> list[Any]:
    """slr's tools as verl's pydantic schemas; a tool verl's schema cannot hold is left out
    (verl then treats its arguments as untyped strings)."""
    from verl.tools.schemas import OpenAIFunctionToolSchema

    out = []
    for tool in tools:
        spec = tool.as_openai()
        fn = dict(spec["function"])
        fn.setdefault("description", "")
        params: dict[str, Any] = dict(fn.get("parameters") or {"type": "object", "properties": {}})
        params["properties"] = {
            k: {"type": "string", **v} if isinstance(v, dict) and "type" not in v else v
            for k, v in (params.get("properties") or {}).items()
        }
        fn["parameters"] = params
        try:
            out.append(
                OpenAIFunctionToolSchema.model_validate({"type": "function", "function": fn})
            )
        except ValueError:
            continue
    return out


class VerlToolParser:
    """slr's ``ToolParser`` over verl's parser for one ``Family``."""

    def __init__(self, family: Family) -> None:
        from verl.experimental.agent_loop.tool_parser import ToolParser as VerlParser

        self.family = family
        self.start_marker = family.start_marker
        self.special_tokens = family.special_tokens
        self.stop_markers = family.stop_markers
        self._verl = VerlParser.get_tool_parser(family.verl_name, _TextTokenizer())

    def parse(self, text: str, tools: Sequence[Tool]) -> Parsed:
        f = self.family
        if not tools or f.start_marker not in text:
            return Parsed(content=self._content(text))
        given = text if not f.prefix or text.startswith(f.prefix) else f.prefix + text
        # verl's parsers decode ids with the tokenizer they were given; ours decodes text
        # to itself, so the text goes where verl's annotation says ids.
        ids: Any = given
        content, found = _Loop.run(self._verl.extract_tool_calls(ids, _verl_tools(tools)))
        calls: list[ToolCall] = []
        for fc in found:
            try:
                args = json.loads(fc.arguments)
            except ValueError:
                break
            if not isinstance(args, dict) or not fc.name:
                break
            calls.append(
                ToolCall(id=fc.tool_call_id or new_call_id(), name=fc.name, arguments=args)
            )
        opened, closed = given.count(f.call_marker), given.count(f.end_marker)
        if not calls or not len(calls) == len(found) == opened == closed:
            return Parsed(content=self._content(text))  # malformed: leave the text as it is
        return Parsed(content=self._content(content).strip(), tool_calls=tuple(calls))

    def _content(self, text: str) -> str:
        return self.family.content(text) if self.family.content else text

    def render_system(self, system: str, tools: Sequence[Tool]) -> str:
        listing = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
        example = self.family.render(
            ToolCall(id="", name="<function-name>", arguments={"<arg>": "<value>"})
        )
        block = (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"The functions, as JSON schemas:\n<tools>\n{listing}\n</tools>\n\n"
            f"To call a function, write:\n{example}"
        )
        return f"{system}\n\n{block}" if system else block

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        parts = [content] if content else []
        return "\n".join(parts + [self.family.render(c) for c in calls])

    def render_results(self, results: Sequence[Message]) -> str:
        return "\n".join(f"<tool_response>\n{m.content}\n</tool_response>" for m in results)


def __getattr__(name: str) -> Callable[[], VerlToolParser]:
    """The registered factories, ``slr_toolparsers_verl.parsers:<name>`` for each name in
    ``slr_toolparsers_verl.NAMES``: the registration stays lazy ("module:attr" strings) and
    verl is imported only when a parser is built."""
    if name in FAMILIES:
        return functools.partial(VerlToolParser, FAMILIES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
