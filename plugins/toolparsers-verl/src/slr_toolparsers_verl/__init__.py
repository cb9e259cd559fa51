"""Tool-call parsers for the model families verl reads, under vLLM's ``--tool-call-parser`` names.

The parsing itself is verl's (``verl.experimental.agent_loop.tool_parser``); ``parsers``
adapts it to slr's ``ToolParser``. Loaded lazily: verl is imported only when a run asks for
one of these names.
"""

from __future__ import annotations

from slr.hookspecs import hookimpl

#: ``[proxy] tool_parser`` name -> the family in ``slr_toolparsers_verl.parsers.FAMILIES``.
NAMES = (
    "qwen3_coder",
    "qwen3_xml",
    "glm45",
    "glm47",
    "kimi_k2",
    "openai",
    "minimax_m2",
    "seed_oss",
    "deepseek_v4",
    "gemma4",
)


@hookimpl
def register_tool_parsers(register):
    for name in NAMES:
        register(name, f"slr_toolparsers_verl.parsers:{name}")
