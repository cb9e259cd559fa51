import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slr.proxy.messages import Message, Tool, ToolCall
from slr.proxy.render import Renderer
from slr.proxy.toolparse import HermesParser

TOOLS = [Tool(name="bash", description="Run a command", parameters={"type": "object"})]

# A minimal template in the style of models that render tools themselves (Qwen 2.5).
NATIVE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == "
    "'system' else '' }}\nTOOLS:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{%- if not (tools and loop.first and m['role'] == 'system') %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c['function']['name'] }}"
    "</call>{% endfor %}{% endif %}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def renderer(smol_tokenizer):
    return Renderer(smol_tokenizer, HermesParser())


def test_chatml_probes(renderer, smol_tokenizer):
    assert renderer.turn_suffix == "<|im_end|>\n"
    assert smol_tokenizer.convert_tokens_to_ids("<|im_end|>") in renderer.stop_token_ids
    assert renderer.native_tools is False
    assert renderer.local is True


def test_tools_go_into_the_system_prompt_when_the_template_lacks_them(renderer):
    msgs = [
        Message(role="user", content="hi"),
        Message(
            role="assistant",
            content="",
            tool_calls=[ToolCall(id="a", name="bash", arguments={"cmd": "ls"})],
        ),
        Message(role="tool", content="a.txt", tool_call_id="a"),
        Message(role="tool", content="b.txt", tool_call_id="b"),
    ]
    text = renderer.render(msgs, TOOLS, generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert '"name": "bash"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>'
        in text
    )
    # consecutive tool results share one user turn
    assert (
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\nb.txt" in text
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_native_template_renders_tools_itself(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = NATIVE_TEMPLATE.replace("TOOLS:", "tools tool_calls:")
    r = Renderer(tok, HermesParser())
    assert r.native_tools
    text = r.render([Message(role="user", content="hi")], TOOLS, generation_prompt=True)
    assert "tools tool_calls:bash;" in text
    assert "# Tools" not in text


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
_call = st.builds(
    ToolCall,
    id=st.just("x"),
    name=st.sampled_from(["bash", "read"]),
    arguments=st.dictionaries(st.sampled_from("ab"), _text, max_size=2),
)
_turn = st.one_of(
    st.builds(Message, role=st.just("user"), content=_text),
    st.builds(Message, role=st.just("tool"), content=_text, tool_call_id=st.just("x")),
    st.builds(Message, role=st.just("system"), content=_text),
)
_assistant = st.builds(
    Message, role=st.just("assistant"), content=_text, tool_calls=st.lists(_call, max_size=2)
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    first=st.one_of(st.none(), st.builds(Message, role=st.just("system"), content=_text)),
    middle=st.lists(st.tuples(_turn, _assistant), max_size=4),
    new=st.lists(_turn, min_size=1, max_size=3),
    tools=st.sampled_from([[], TOOLS]),
)
def test_stub_delta_equals_full_render_delta(renderer, first, middle, new, tools):
    history = [first] if first else []
    for turn, reply in middle:
        history += [turn, reply]
    history += [Message(role="user", content="go"), Message(role="assistant", content="ok")]
    full_before = renderer.render(history, tools, generation_prompt=False)
    full_after = renderer.render([*history, *new], tools, generation_prompt=True)
    assert full_after.startswith(full_before)
    assert renderer.delta(history, new, tools) == full_after[len(full_before) :]


def test_closing_is_what_the_template_adds_after_the_models_eos(renderer, smol_tokenizer):
    eos = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = smol_tokenizer.encode("Hi", add_special_tokens=False)
    assert renderer.closing([*ids, eos]) == "\n"
    assert renderer.closing(ids) == "<|im_end|>\n"  # cut off by max_tokens: close the turn
