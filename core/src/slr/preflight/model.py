"""Checks of a model's tokenizer against the run config, for engine plugins to call.

An engine plugin knows where its tokenizer comes from (a cached folder, a server); the
questions asked of it are the same for every engine, so they live here:

- the chat template exists and its output survives encode / decode (what the proxy relies
  on to reuse recorded token ids);
- a tool call rendered by the template (the proxy's renderer: native ``tool_calls`` or the
  parser's own syntax) parses back with ``proxy.tool_parser`` into the same call, for the
  protocol the scaffold speaks;
- the context holds a prompt plus ``rollout.max_tokens``.
"""

from __future__ import annotations

from typing import Any

from slr.preflight import CheckResult, Context, fatal, ok, warn

#: The smallest prompt worth running an agent with (a system prompt with a few tools).
MIN_PROMPT_TOKENS = 1024
_PROBE_ARGS = {"command": "ls -la /app", "timeout": 30}


def chat_template_round_trip(tokenizer: Any) -> CheckResult:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return fatal(
            "the tokenizer has no chat template; the proxy renders every request with it",
            fix="use an instruct / chat model, or add a chat_template to its tokenizer_config.json",
        )
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List the files in /app, then say done."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    back = tokenizer.decode(ids, skip_special_tokens=False)
    if back != text:
        return fatal(
            "the chat template's text does not survive encode/decode (the tokenizer "
            "normalises it), so recorded token ids cannot be reused",
            fix="use the model's own tokenizer files (a tokenizer.json that matches the "
            "template), and check `slr models pull` converted it",
        )
    return ok(f"chat template renders and round-trips ({len(ids)} tokens for a probe prompt)")


def tool_call_round_trip(tokenizer: Any, parser_name: str, protocol: str) -> CheckResult:
    """Render an assistant turn that makes a tool call and parse it back."""
    from slr.proxy.messages import Message, Tool, ToolCall
    from slr.proxy.render import Renderer
    from slr.proxy.toolparse import get_tool_parser

    tool = Tool(
        name="bash",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    )
    call = ToolCall(id="call_probe", name="bash", arguments=dict(_PROBE_ARGS))
    prefix = [Message(role="system", content="s"), Message(role="user", content="go")]
    turn = Message(role="assistant", content="", tool_calls=(call,))
    parser = get_tool_parser(parser_name)
    renderer = Renderer(tokenizer, parser)
    before = renderer.render(prefix, [tool], generation_prompt=True)
    after = renderer.render([*prefix, turn], [tool], generation_prompt=False)
    where = f"proxy.tool_parser = {parser_name!r}, scaffold protocol {protocol}"
    how = "the template's own tool_calls" if renderer.native_tools else "the parser's syntax"
    if not after.startswith(before):
        return warn(
            f"the template does not render an assistant turn as an extension of the prompt "
            f"({where}); tool calls cannot be checked this way",
            fix="check a real transcript (trials/<id>/proxy.json) after the first step",
        )
    generated = after[len(before) :]
    if renderer.turn_suffix and generated.endswith(renderer.turn_suffix):
        generated = generated[: -len(renderer.turn_suffix)]
    parsed = parser.parse(generated, [tool])
    got = [(c.name, c.arguments) for c in parsed.tool_calls]
    if got != [("bash", _PROBE_ARGS)]:
        return fatal(
            f"a tool call rendered by the chat template ({how}) does not parse back with "
            f"{where}: the model writes {generated.strip()[:120]!r}, the parser reads {got}",
            fix="set proxy.tool_parser to the parser of this model family",
            doc="docs/troubleshooting/rollout.md#tool-calls-arrive-as-text",
        )
    return ok(f"a tool call rendered by the chat template ({how}) parses back ({where})")


def context_length(ctx: Context, context: int | None, *, prompt_tokens: int = 0) -> CheckResult:
    """``context`` (the engine's limit; None: unknown) vs ``rollout.max_tokens`` + a prompt."""
    max_tokens = ctx.config.rollout.max_tokens
    if context is None:
        return warn(
            f"the model's context length is unknown; rollout.max_tokens = {max_tokens}",
            fix="set the engine's max_context",
        )
    prompt = max(prompt_tokens, MIN_PROMPT_TOKENS)
    if max_tokens >= context:
        return fatal(
            f"rollout.max_tokens = {max_tokens} leaves no room for a prompt in the model's "
            f"{context}-token context: every call would end in context_overflow",
            fix=f"lower rollout.max_tokens well below {context}, or use a model with a longer "
            f"context",
            doc="docs/troubleshooting/rollout.md#context-overflow",
        )
    if max_tokens + prompt > context:
        return warn(
            f"context {context} tokens holds at most a {context - max_tokens}-token prompt "
            f"with rollout.max_tokens = {max_tokens}; an agent's first prompt is often longer",
            fix=f"lower rollout.max_tokens to at most {max(context - prompt, 1)}, or use a "
            f"model with a longer context",
            doc="docs/troubleshooting/rollout.md#context-overflow",
        )
    return ok(f"context {context} tokens >= a {prompt}-token prompt + max_tokens {max_tokens}")
