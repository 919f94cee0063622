"""Tool calls in and out, without a model: tools reach the chat template (or the Hermes prompt
when the template does not read them), and `<tool_call>` blocks become calls, whole or streamed
in any split."""

from __future__ import annotations

import json

import pytest

from kiln.serving.api.openai.protocol import ChatCompletionRequest
from kiln.serving.api.openai.tool_parser import ToolCallStream, parse_tool_calls
from kiln.serving.api.openai.tools import template_messages, template_tools
from kiln.serving.chat_template import render_chat
from kiln.text.chat_template import reads_tools
from tests.engine.tiny import train_tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
# a Qwen2.5-style template: tools in the system turn, calls and tool answers in its own markup
QWEN_LIKE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t.function.name }}:"
    "{{ t.function.parameters | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call>{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}</call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Kyoto"}'},
}
CONVERSATION = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
]


def _render(template: str | None) -> str:
    req = ChatCompletionRequest(messages=CONVERSATION, tools=[TOOL])
    tools, in_template = list(req.tools or []), reads_tools(template)
    messages = template_messages(req.messages, tools, in_template)
    passed = template_tools(tools) if in_template else None
    return render_chat(messages, template, {}, True, tools=passed)


def test_a_template_that_reads_tools_gets_them_and_the_calls_as_objects():
    text = _render(QWEN_LIKE)
    assert 'get_weather:{"type": "object"' in text
    assert '<call>get_weather{"city": "Kyoto"}</call>' in text  # arguments as an object
    assert "<|im_start|>tool\nrain<|im_end|>" in text
    assert "<tool_call>" not in text


def test_tools_and_calls_render_as_transformers_apply_chat_template_renders_them():
    from transformers import PreTrainedTokenizerFast  # the test extra's; slow to import

    tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer())
    as_transformers = [
        CONVERSATION[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Kyoto"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    ]
    expected = tok.apply_chat_template(
        as_transformers,
        tools=[TOOL],
        chat_template=QWEN_LIKE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert _render(QWEN_LIKE) == expected


def test_a_template_without_tools_gets_the_hermes_prompt_and_markup():
    text = _render(None)  # ChatML
    assert text.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(TOOL) in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Kyoto"}}\n</tool_call>' in text
    )
    assert "<|im_start|>user\n<tool_response>\nrain\n</tool_response><|im_end|>" in text


TEXT = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Kyoto"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
)


def test_hermes_blocks_parse_into_calls_and_the_rest_stays_content():
    content, calls = parse_tool_calls(TEXT)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Kyoto"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    assert parse_tool_calls("no calls <tool_call>{oops}</tool_call>") == (
        "no calls <tool_call>{oops}</tool_call>",
        [],
    )
    assert parse_tool_calls('cut <tool_call>\n{"name": ') == ('cut <tool_call>\n{"name": ', [])


@pytest.mark.parametrize("size", [1, 2, 3, 7, 11, 1000])
def test_streamed_text_in_any_split_gives_the_same_calls_and_content(size):
    stream, out = ToolCallStream(), []
    for k in range(0, len(TEXT), size):
        out += stream.feed(TEXT[k : k + size])
    out += stream.finish()
    content = "".join(p for p in out if isinstance(p, str))
    calls = [p for p in out if not isinstance(p, str)]
    assert content.strip() == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [
        (c.name, c.arguments) for c in parse_tool_calls(TEXT)[1]
    ]
    assert "<" not in content  # no half tag ever leaked as content
