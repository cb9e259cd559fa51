import attrs
import pytest

from slr import hookimpl
from slr.errors import ConfigError
from slr.proxy.messages import Tool, ToolCall
from slr.proxy.toolparse import HermesParser, get_tool_parser, tool_parser_names

TOOLS = [Tool(name="bash", parameters={"type": "object"})]


def test_parses_calls_and_keeps_surrounding_text():
    text = (
        "Let me look.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
        '<tool_call>{"name": "bash", "arguments": "{\\"cmd\\": \\"pwd\\"}"}</tool_call>'
    )
    parsed = HermesParser().parse(text, TOOLS)
    assert parsed.content == "Let me look."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("bash", {"cmd": "ls"}),
        ("bash", {"cmd": "pwd"}),
    ]
    assert parsed.tool_calls[0].id != parsed.tool_calls[1].id


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "bash", "arguments": {"cmd": ',
        '["bash"]',
        '{"arguments": {}}',
        '{"name": "x", "arguments": 3}',
    ],
)
def test_malformed_call_stays_text(body):
    text = f"before <tool_call>{body}</tool_call> after"
    parsed = HermesParser().parse(text, TOOLS)
    assert parsed.tool_calls == ()
    assert parsed.content == text


def test_unterminated_call_at_the_end_is_parsed():
    parsed = HermesParser().parse('<tool_call>\n{"name": "bash", "arguments": {}}\n', TOOLS)
    assert [c.name for c in parsed.tool_calls] == ["bash"]
    assert parsed.content == ""


def test_no_tools_offered_means_no_parsing():
    text = '<tool_call>{"name": "bash", "arguments": {}}</tool_call>'
    assert HermesParser().parse(text, []).content == text


def test_rendered_call_parses_back():
    parser = HermesParser()
    call = ToolCall(id="c", name="bash", arguments={"cmd": "echo ü"})
    parsed = parser.parse(parser.render_calls("hi", [call]), TOOLS)
    assert parsed.content == "hi"
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("bash", {"cmd": "echo ü"})]


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ConfigError, match="hermes"):
        get_tool_parser("nonesuch")


def test_a_plugin_registers_a_parser_the_proxy_config_names(slr_plugins):
    class UpperParser(HermesParser):
        """A stand-in family: hermes calls with the tool name upper-cased."""

        def parse(self, text, tools):
            parsed = super().parse(text, tools)
            return attrs.evolve(
                parsed,
                tool_calls=tuple(attrs.evolve(c, name=c.name.upper()) for c in parsed.tool_calls),
            )

    class Plugin:
        @hookimpl
        def register_tool_parsers(self, register):
            register("upper", UpperParser)

    slr_plugins.register(Plugin(), name="upper", distribution="slr-toolparsers-upper")
    assert "upper" in tool_parser_names()
    parser = get_tool_parser("upper")
    text = HermesParser().render_calls("", [ToolCall(id="c", name="bash", arguments={})])
    assert [c.name for c in parser.parse(text, TOOLS).tool_calls] == ["BASH"]


def test_qwen_names_the_two_formats_it_could_mean():
    with pytest.raises(ConfigError) as err:
        get_tool_parser("qwen")
    assert "hermes" in str(err.value) and "qwen3_coder" in str(err.value)
