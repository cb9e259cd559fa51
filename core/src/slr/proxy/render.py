"""Messages -> text with the model's own chat template, and text -> token ids.

``Renderer.delta`` is what keeps per-call work flat in a long conversation: for templates
that render each turn on its own (checked once with a probe conversation, see
``_is_local``), the text a request adds after the recorded history is rendered from a stub
of the history (the first message and the last one) instead of the whole conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slr.proxy.errors import ApiError
from slr.proxy.messages import Message, Tool, ToolCall
from slr.proxy.toolparse import ToolParser

_SENTINEL = "\x1eSLR-SENTINEL\x1e"


def turn_suffix(tokenizer: Any) -> str:
    """The text a tokenizer's chat template puts right after an assistant message's content
    (ChatML: ``<|im_end|>\\n``): how a turn the model ended is closed."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}],
        tokenize=False,
        add_generation_prompt=False,
    )
    return text[text.rindex(_SENTINEL) + len(_SENTINEL) :]


class Renderer:
    def __init__(self, tokenizer: Any, parser: ToolParser) -> None:
        self.tokenizer = tokenizer
        self.parser = parser
        template = tokenizer.chat_template
        if template is None:
            raise ValueError("the engine's tokenizer has no chat template; the proxy needs one")
        source = template if isinstance(template, str) else " ".join(dict(template).values())
        # A template that never mentions tools would silently drop them: render them ourselves.
        self.native_tools = "tools" in source and "tool_calls" in source
        self.turn_suffix = self._turn_suffix()
        self.stop_token_ids = self._stop_token_ids()
        self.local = self._is_local()

    # -- rendering ------------------------------------------------------------------------

    def template_input(
        self, messages: Sequence[Message], tools: Sequence[Tool]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        if self.native_tools:
            return [_native(m) for m in messages], [t.as_openai() for t in tools] or None
        out: list[dict[str, Any]] = []
        pending: list[Message] = []
        for m in messages:
            if m.role == "tool":
                pending.append(m)
                continue
            if pending:
                out.append({"role": "user", "content": self.parser.render_results(pending)})
                pending = []
            if m.role == "assistant" and m.tool_calls:
                out.append(
                    {
                        "role": "assistant",
                        "content": self.parser.render_calls(m.content, m.tool_calls),
                    }
                )
            else:
                out.append({"role": m.role, "content": m.content})
        if pending:
            out.append({"role": "user", "content": self.parser.render_results(pending)})
        if tools:
            if out and out[0]["role"] == "system":
                out[0] = {
                    "role": "system",
                    "content": self.parser.render_system(out[0]["content"], tools),
                }
            else:
                out.insert(0, {"role": "system", "content": self.parser.render_system("", tools)})
        return out, None

    def render(
        self, messages: Sequence[Message], tools: Sequence[Tool], *, generation_prompt: bool
    ) -> str:
        msgs, tool_list = self.template_input(messages, tools)
        try:
            return self.tokenizer.apply_chat_template(
                msgs, tools=tool_list, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as exc:  # jinja's raise_exception(...) and template bugs
            raise ApiError(
                "invalid_request", f"the model's chat template rejected the messages: {exc}"
            ) from None

    def delta(
        self, history: Sequence[Message], new: Sequence[Message], tools: Sequence[Tool]
    ) -> str | None:
        """Text that ``new`` adds after ``history`` (plus the generation prompt), or None when
        the template does not render the longer conversation as an extension of the shorter."""
        if self.local and len(history) > 2:
            history = [history[0], history[-1]]
        before = self.render(history, tools, generation_prompt=False)
        after = self.render([*history, *new], tools, generation_prompt=True)
        if not after.startswith(before) or not before.endswith(self.turn_suffix):
            return None
        return after[len(before) :]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def single_token(self, text: str) -> int | None:
        """The id of ``text`` when the tokenizer has it as one token (a special or added
        token, such as a tool-call marker), else None."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 and self.decode(ids) == text else None

    def strip_special(self, text: str) -> str:
        """``text`` without the special tokens' text (what the agent is shown of a reply
        that was decoded with them for the tool parser)."""
        for token in self._special_texts:
            text = text.replace(token, "")
        return text

    @property
    def _special_texts(self) -> list[str]:
        found = getattr(self, "_special_cache", None)
        if found is None:
            added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
            texts = set(self.tokenizer.all_special_tokens)
            texts.update(t.content for t in added.values() if getattr(t, "special", False))
            found = sorted((t for t in texts if t), key=len, reverse=True)
            self._special_cache = found
        return found

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def closing(self, generated: Sequence[int]) -> str:
        """Template text that ends an assistant turn and that the model did not generate."""
        suffix = self.turn_suffix
        if generated and generated[-1] in self.stop_token_ids:
            stop_text = self.decode(generated[-1:])
            if suffix.startswith(stop_text):
                return suffix[len(stop_text) :]
        return suffix

    # -- probes (once per tokenizer) ------------------------------------------------------

    def _probe(self, messages: list[dict[str, Any]], gen: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen
        )

    def _turn_suffix(self) -> str:
        return turn_suffix(self.tokenizer)

    def _stop_token_ids(self) -> frozenset[int]:
        ids = set()
        eos = self.tokenizer.eos_token_id
        if eos is not None:
            ids.add(int(eos))
        suffix_ids = self.encode(self.turn_suffix) if self.turn_suffix else []
        if suffix_ids and suffix_ids[0] in set(self.tokenizer.all_special_ids):
            ids.add(int(suffix_ids[0]))
        return frozenset(ids)

    def _is_local(self) -> bool:
        tools = [Tool(name="probe", description="p", parameters={"type": "object"})]
        call = ToolCall(id="c1", name="probe", arguments={"a": 1})
        conv = [
            Message(role="system", content="s"),
            Message(role="user", content="u1"),
            Message(role="assistant", content="a1", tool_calls=(call,)),
            Message(role="tool", content="r1", tool_call_id="c1"),
            Message(role="assistant", content="a2"),
            Message(role="user", content="u2"),
            Message(role="assistant", content="a3"),
        ]
        new = [Message(role="user", content="u3")]
        for history in (conv, conv[1:]):
            for tool_set in (tools, []):
                before = self.render(history, tool_set, generation_prompt=False)
                after = self.render([*history, *new], tool_set, generation_prompt=True)
                stub = [history[0], history[-1]]
                s_before = self.render(stub, tool_set, generation_prompt=False)
                s_after = self.render([*stub, *new], tool_set, generation_prompt=True)
                if not (after.startswith(before) and s_after.startswith(s_before)):
                    return False
                if after[len(before) :] != s_after[len(s_before) :]:
                    return False
        return True


def _native(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
        if m.name:
            out["name"] = m.name
    return out
