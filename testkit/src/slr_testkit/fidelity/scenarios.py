"""The sessions the fidelity matrix replays: one per scaffold, in that scaffold's wire shape.

Each scenario is a script of calls as the scaffold makes them: which API it speaks
(Anthropic Messages or OpenAI Chat Completions), whether it streams, which conversations it
holds at once (a main agent, a sub-agent, a compacted continuation, a summarizer) and what
each call adds (a user turn, tool results) before the model answers. The answers are
fixed (text, a tool call, reasoning): the replay forces them through the engine, so every
run sees the same tokens and the checks are exact.

The shapes follow what the adapters' end-to-end tests saw each scaffold send
(docs/agents.md): Claude Code puts its system prompt in ``system`` and answers tool calls
with ``tool_result`` blocks and compacts by asking for a summary, then starting again from
it; OpenCode does the same over OpenAI's API, streaming; OpenHands does not stream and
condenses through a separate summarizing call; mini-swe-agent and Terminus-2 have no tools,
sub-agents or compaction: plain text turns (a bash block; a JSON command list).
"""

from __future__ import annotations

from typing import Any, Literal

from attrs import field, frozen

from slr.proxy.messages import Tool


@frozen(kw_only=True)
class Reply:
    """What the model answers: reasoning (shown by families that think), text, one call."""

    text: str = ""
    call: tuple[str, dict[str, Any]] | None = None
    reasoning: str = ""


Added = tuple[Literal["user", "tool"], str]


@frozen(kw_only=True)
class Call:
    """One model call: the conversation it belongs to, what it adds, and the answer.

    ``add`` items are ``("user", text)`` or ``("tool", result)`` (the result of the
    conversation's last tool call)."""

    convo: str
    add: tuple[Added, ...] = field(converter=tuple)
    reply: Reply


@frozen(kw_only=True)
class Conversation:
    system: str
    tools: tuple[Tool, ...] = ()


@frozen(kw_only=True)
class Scenario:
    scaffold: str
    api: Literal["anthropic", "openai"]
    stream: bool
    conversations: dict[str, Conversation]
    calls: tuple[Call, ...] = field(converter=tuple)
    # the features the scaffold has; a missing one is an N/A cell part, with the reason
    features: dict[str, str | None] = field(factory=dict)  # name -> None (has it) or why not


def _tool(name: str, description: str, **props: str) -> Tool:
    return Tool(
        name=name,
        description=description,
        parameters={
            "type": "object",
            "properties": {p: {"type": "string", "description": d} for p, d in props.items()},
            "required": list(props),
        },
    )


def _agentic(
    scaffold: str,
    api: Literal["anthropic", "openai"],
    stream: bool,
    names: dict[str, str],
    condenser: bool,
) -> Scenario:
    """A tool-using session: two tool calls, a sub-agent, a fix, then a compaction."""
    bash, read, task = names["bash"], names["read"], names["task"]
    tools = (
        _tool(bash, "Run a shell command and return its output.", command="the command"),
        _tool(read, "Read a file.", path="the file's path"),
        _tool(task, "Start a sub-agent on a self-contained task.", prompt="what it must do"),
    )
    sub_tools = tools[:2]
    system = (
        f"You are {scaffold}, a coding agent working in a repository. Use the tools to "
        "inspect and change files; run the tests before you finish. Be brief."
    )
    summary = "Summary: add() in calc.py subtracted; fixed it, tests pass. Left: lint."
    calls = [
        Call(
            convo="main",
            add=[("user", "Fix the failing test in calc.py.")],
            reply=Reply(
                reasoning="Run the tests first.",
                text="Running the tests.",
                call=(bash, {"command": "pytest -q"}),
            ),
        ),
        Call(
            convo="main",
            add=[("tool", "F.\n1 failed: test_add")],
            reply=Reply(reasoning="Read the code.", call=(read, {"path": "calc.py"})),
        ),
        Call(
            convo="main",
            add=[("tool", "def add(a, b):\n    return a - b\n")],
            reply=Reply(
                reasoning="Other callers may rely on it.",
                text="Asking a sub-agent for the callers.",
                call=(task, {"prompt": "Find every caller of add() in the repository."}),
            ),
        ),
        Call(
            convo="sub",
            add=[("user", "Find every caller of add() in the repository.")],
            reply=Reply(reasoning="grep for it.", call=(bash, {"command": "grep -rn 'add(' ."})),
        ),
        Call(
            convo="sub",
            add=[
                ("tool", "./calc.py:1:def add(a, b):\n./test_calc.py:4:    assert add(1, 2) == 3")
            ],
            reply=Reply(reasoning="Only the test.", text="add() is called in test_calc.py only."),
        ),
        Call(
            convo="main",
            add=[("tool", "add() is called in test_calc.py only.")],
            reply=Reply(
                reasoning="Safe to fix.",
                call=(bash, {"command": "sed -i 's/a - b/a + b/' calc.py"}),
            ),
        ),
        Call(
            convo="main",
            add=[("tool", "")],
            reply=Reply(reasoning="Check again.", call=(bash, {"command": "pytest -q"})),
        ),
        Call(
            convo="main",
            add=[("tool", ".\n1 passed")],
            reply=Reply(reasoning="Done.", text="Fixed: add() subtracted instead of adding."),
        ),
    ]
    conversations = {
        "main": Conversation(system=system, tools=tools),
        "sub": Conversation(
            system="You are a search sub-agent. Report what you find.", tools=sub_tools
        ),
        "compacted": Conversation(system=system, tools=tools),
    }
    continued = (
        "This session continues from an earlier conversation that ran out of context. "
        f"{summary} Continue: make sure the linter is clean."
    )
    first: list[Added]
    if condenser:
        # a separate summarizing call, then the condensed history (task + summary)
        conversations["summarizer"] = Conversation(
            system="You summarize an agent's history for its continuation."
        )
        calls.append(
            Call(
                convo="summarizer",
                add=[
                    ("user", "Events: ran tests (1 failed), read calc.py, fixed add(), tests pass.")
                ],
                reply=Reply(reasoning="Condense.", text=summary),
            )
        )
        first = [("user", "Fix the failing test in calc.py."), ("user", continued)]
    else:
        # the scaffold asks the main conversation for a summary, then starts from it
        calls.append(
            Call(
                convo="main",
                add=[("user", "Summarize this conversation so that it can be continued.")],
                reply=Reply(reasoning="Summarize.", text=summary),
            )
        )
        first = [("user", continued)]
    calls += [
        Call(
            convo="compacted",
            add=first,
            reply=Reply(reasoning="Lint.", call=(bash, {"command": "ruff check ."})),
        ),
        Call(
            convo="compacted",
            add=[("tool", "All checks passed!")],
            reply=Reply(reasoning="Finished.", text="The linter is clean; the task is done."),
        ),
    ]
    return Scenario(
        scaffold=scaffold,
        api=api,
        stream=stream,
        conversations=conversations,
        calls=calls,
        features={"tool calls": None, "sub-agent": None, "compaction": None},
    )


def _text_only(scaffold: str, system: str, turns: list[tuple[str, str]]) -> Scenario:
    calls = [
        Call(convo="main", add=[("user", user)], reply=Reply(reasoning=f"Turn {i}.", text=text))
        for i, (user, text) in enumerate(turns)
    ]
    return Scenario(
        scaffold=scaffold,
        api="openai",
        stream=False,
        conversations={"main": Conversation(system=system)},
        calls=calls,
        features=dict.fromkeys(("tool calls", "sub-agent", "compaction"), "the scaffold has none"),
    )


def scenarios() -> list[Scenario]:
    """The five scaffolds' sessions, in the order of the matrix's rows."""
    mini = _text_only(
        "mini-swe-agent",
        "You are a helpful assistant that can interact with a computer. Reply with one "
        "THOUGHT and exactly one bash code block.",
        [
            (
                "Fix the failing test in calc.py.",
                "THOUGHT: run the tests.\n\n```bash\npytest -q\n```",
            ),
            (
                "<returncode>1</returncode>\n<output>1 failed: test_add</output>",
                "THOUGHT: fix add().\n\n```bash\nsed -i 's/a - b/a + b/' calc.py\n```",
            ),
            (
                "<returncode>0</returncode>\n<output></output>",
                "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
            ),
        ],
    )
    terminus = _text_only(
        "terminus-2",
        "",
        [
            (
                "You are an AI assistant solving a command-line task. Task: fix the failing "
                'test in calc.py. Answer with JSON: {"analysis", "plan", "commands", '
                '"task_complete"}.\n\nCurrent terminal state:\n$ ',
                '{"analysis": "Nothing run yet.", "plan": "Run the tests.", "commands": '
                '[{"keystrokes": "pytest -q\\n", "duration": 1.0}], "task_complete": false}',
            ),
            (
                "New terminal output:\n1 failed: test_add\n$ ",
                '{"analysis": "add() is wrong.", "plan": "Fix it.", "commands": [{"keystrokes": '
                '"sed -i \'s/a - b/a + b/\' calc.py\\n", "duration": 0.1}], "task_complete": true}',
            ),
            (
                "Are you sure you want to mark the task as complete? Answer again with "
                "task_complete true to confirm.",
                '{"analysis": "Fixed.", "plan": "", "commands": [], "task_complete": true}',
            ),
        ],
    )
    return [
        _agentic(
            "claude-code",
            "anthropic",
            True,
            {"bash": "Bash", "read": "Read", "task": "Task"},
            condenser=False,
        ),
        _agentic(
            "opencode", "openai", True, {"bash": "bash", "read": "read", "task": "task"}, False
        ),
        _agentic(
            "openhands",
            "openai",
            False,
            {"bash": "execute_bash", "read": "file_editor", "task": "delegate"},
            condenser=True,
        ),
        terminus,
        mini,
    ]
