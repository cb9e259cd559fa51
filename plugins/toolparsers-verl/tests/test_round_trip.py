"""Each verl-read family: a call written by the family's chat template parses back to itself.

The templates below are the tool-call part of each family's published chat template, cut
down to a user turn, an assistant turn and the generation prompt (DeepSeek-V4 ships an
encoder script instead of a template, and gpt-oss's template writes the recipient before the
channel when it replays history; both are written here in the form the model generates, as
each family's format documentation shows it). The completion is the text after the
generation prompt, as the proxy decodes it (special tokens kept for these families).
"""

from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from slr.proxy.messages import Tool, ToolCall
from slr.proxy.toolparse import get_tool_parser

pytestmark = pytest.mark.timeout(120)

TOOLS = [
    Tool(
        name="bash",
        description="Run a command",
        parameters={
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["cmd"],
        },
    )
]
CALL = ToolCall(id="functions.bash:0", name="bash", arguments={"cmd": "ls -la 'ü'", "timeout": 30})

_USER = "{%- for m in messages %}{%- if m.role == 'user' %}"
_ASSISTANT = "{%- elif m.role == 'assistant' %}"
_END = "{%- endif %}{%- endfor %}"

TEMPLATES = {
    "qwen3_coder": _USER
    + "{{- '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}"
    + _ASSISTANT
    + "{{- '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for tool_call in m.tool_calls %}{%- set tool_call = tool_call.function %}"
    "{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{%- for args_name, args_value in tool_call.arguments|items %}"
    "{{- '<parameter=' + args_name + '>\\n' }}"
    "{%- set args_value = args_value | tojson | safe if args_value is mapping or "
    "(args_value is sequence and args_value is not string) else args_value | string %}"
    "{{- args_value }}{{- '\\n</parameter>\\n' }}{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    + _END
    + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "glm45": _USER + "<|user|>\n{{ m.content }}" + _ASSISTANT + "<|assistant|>"
    "{%- for tc in m.tool_calls %}{%- set tc = tc.function %}"
    "{{ '\\n<tool_call>' + tc.name }}\n{% for k, v in tc.arguments.items() %}"
    "<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v | tojson(ensure_ascii=False) if v is not "
    "string else v }}</arg_value>\n{% endfor %}</tool_call>{% endfor %}"
    + _END
    + "{%- if add_generation_prompt %}<|assistant|>{%- endif %}",
    "glm47": _USER + "<|user|>{{ m.content }}" + _ASSISTANT + "<|assistant|>"
    "{%- for tc in m.tool_calls %}{%- set tc = tc.function %}"
    "{{ '<tool_call>' + tc.name -}}{% for k, v in tc.arguments.items() %}"
    "<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) if v is not "
    "string else v }}</arg_value>{% endfor %}</tool_call>{% endfor %}"
    + _END
    + "{%- if add_generation_prompt %}<|assistant|>{%- endif %}",
    "kimi_k2": _USER
    + "<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
    + _ASSISTANT
    + "<|im_assistant|>assistant<|im_middle|>{{ m.content or '' }}"
    "{{ '<|tool_calls_section_begin|>' }}{%- for tool_call in m.tool_calls -%}"
    "<|tool_call_begin|>{{ tool_call.id }}<|tool_call_argument_begin|>"
    "{{ tool_call.function.arguments | tojson }}<|tool_call_end|>{%- endfor -%}"
    "<|tool_calls_section_end|><|im_end|>"
    + _END
    + "{%- if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{%- endif %}",
    "openai": _USER
    + "<|start|>user<|message|>{{ m.content }}<|end|>"
    + _ASSISTANT
    + "{%- for tool_call in m.tool_calls %}"
    "{{- '<|start|>assistant<|channel|>commentary to=functions.' + tool_call.function.name "
    "+ ' <|constrain|>json<|message|>' }}{{- tool_call.function.arguments | tojson }}"
    "{{- '<|call|>' }}{%- endfor %}"
    + _END
    + "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}",
    "minimax_m2": _USER + "]~b]user\n{{ m.content }}[e~[\n" + _ASSISTANT + "]~b]ai\n"
    "{{- '<minimax:tool_call>\\n' }}{%- for tool_call in m.tool_calls -%}"
    "{%- set tool_call = tool_call.function %}"
    "{{- '<invoke name=\"' + tool_call.name + '\">' }}\n{%- for k, v in tool_call.arguments.items() %}"
    "{{- '<parameter name=\"' + k + '\">' }}{{- v | tojson(ensure_ascii=False) if v is not "
    "string else v }}{{- '</parameter>' }}\n{% endfor %}{{- '</invoke>\\n' }}{%- endfor -%}"
    "{{- '</minimax:tool_call>' }}[e~[\n"
    + _END
    + "{%- if add_generation_prompt %}]~b]ai\n{%- endif %}",
    "seed_oss": _USER
    + "<seed:bos>user\n{{ m.content }}<seed:eos>"
    + _ASSISTANT
    + "<seed:bos>assistant\n{%- for tool_call in m.tool_calls %}{%- set tool_call = tool_call.function %}"
    "{{- '\\n<seed:tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{%- for arg_name, arg_value in tool_call.arguments | items %}"
    "{{- '<parameter=' + arg_name + '>' }}{%- set arg_value = arg_value | tojson if arg_value "
    "is mapping or (arg_value is sequence and arg_value is not string) else arg_value | string %}"
    "{{- arg_value }}{{- '</parameter>\\n' }}{%- endfor %}"
    "{{- '</function>\\n</seed:tool_call>' }}{%- endfor %}<seed:eos>"
    + _END
    + "{%- if add_generation_prompt %}<seed:bos>assistant\n{%- endif %}",
    "deepseek_v4": _USER + "<｜User｜>{{ m.content }}" + _ASSISTANT + "<｜Assistant｜></think>"
    "\n\n<｜DSML｜tool_calls>\n{%- for tool_call in m.tool_calls %}"
    '{%- set tool_call = tool_call.function %}\n<｜DSML｜invoke name="{{ tool_call.name }}">'
    '{%- for k, v in tool_call.arguments.items() %}\n<｜DSML｜parameter name="{{ k }}" '
    "string=\"{{ 'true' if v is string else 'false' }}\">{{ v if v is string else v | tojson }}"
    "</｜DSML｜parameter>{%- endfor %}\n</｜DSML｜invoke>{%- endfor %}\n</｜DSML｜tool_calls>"
    "<｜end▁of▁sentence｜>"
    + _END
    + "{%- if add_generation_prompt %}<｜Assistant｜></think>{%- endif %}",
    "gemma4": _USER + "<|turn>user\n{{ m.content }}<turn|>\n" + _ASSISTANT + "<|turn>model\n"
    "{%- for tool_call in m.tool_calls %}{%- set tool_call = tool_call.function %}"
    "{{- '<|tool_call>call:' + tool_call.name + '{' }}"
    "{%- for k, v in tool_call.arguments | dictsort %}{{- k + ':' }}"
    "{%- if v is string %}{{- '<|\"|>' + v + '<|\"|>' }}{%- else %}{{- v | tojson }}{%- endif %}"
    "{%- if not loop.last %},{% endif %}{%- endfor %}{{- '}<tool_call|>' }}{%- endfor %}"
    + _END
    + "{%- if add_generation_prompt %}<|turn>model\n{%- endif %}",
}
TEMPLATES["qwen3_xml"] = TEMPLATES["qwen3_coder"]


def completion(template: str, call: ToolCall) -> str:
    """What the model generates for ``call``: the template's assistant turn after the
    generation prompt."""
    user = {"role": "user", "content": "list the files"}
    openai_call = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    assistant = {"role": "assistant", "content": "", "tool_calls": [openai_call]}
    tools = [t.as_openai() for t in TOOLS]
    prompt = render_jinja_template(
        conversations=[[user]], tools=tools, chat_template=template, add_generation_prompt=True
    )[0][0]
    full = render_jinja_template(
        conversations=[[user, assistant]], tools=tools, chat_template=template
    )[0][0]
    assert full.startswith(prompt), (prompt, full)
    return full[len(prompt) :]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_template_call_parses_back(name):
    parser = get_tool_parser(name)
    text = completion(TEMPLATES[name], CALL)
    parsed = parser.parse(text, TOOLS)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(CALL.name, CALL.arguments)], text
    assert "bash" not in parsed.content


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_parser_renders_what_it_reads(name):
    parser = get_tool_parser(name)
    parsed = parser.parse(parser.render_calls("", [CALL]), TOOLS)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(CALL.name, CALL.arguments)]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_malformed_call_stays_in_the_text(name):
    parser = get_tool_parser(name)
    text = completion(TEMPLATES[name], CALL)
    # Cut the call short: its closing markup (and, for JSON formats, its closing brace) is gone.
    broken = text[: text.rindex("30") + 1]
    parsed = parser.parse(broken, TOOLS)
    assert parsed.tool_calls == ()
    assert parsed.content == broken


def test_qwen_is_no_longer_hermes_in_disguise():
    from slr.errors import ConfigError

    with pytest.raises(ConfigError, match="qwen3_coder") as err:
        get_tool_parser("qwen")
    assert "hermes" in str(err.value)
