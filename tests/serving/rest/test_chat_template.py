"""Chat templates render as transformers' `apply_chat_template` renders them."""

from __future__ import annotations

import pytest

from kiln.serving.chat_template import render_chat
from kiln.text.chat_template import CHATML, end_of_turn_markers

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "What is a kiln?"},
]
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
STRICT = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('no system role') }}{% endif %}{{ message['content'] }}{% endfor %}"
)


@pytest.mark.parametrize("template", [CHATML, LLAMA3], ids=["chatml", "llama3"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_equals_transformers(tiny_model_dir, template, add_generation_prompt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = template
    tok.bos_token = "<|endoftext|>"
    expected = tok.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    assert render_chat(MESSAGES, template, special, add_generation_prompt) == expected


def test_template_errors_are_client_errors():
    from kiln.serving.api.protocol import RequestError

    with pytest.raises(RequestError, match="no system role"):
        render_chat(MESSAGES, STRICT, {})


def test_end_of_turn_markers():
    assert end_of_turn_markers(None, {}) == ["<|im_end|>"]
    assert end_of_turn_markers(LLAMA3, {"eos_token": "<|end_of_text|>"}) == [
        "<|eot_id|>",
        "<|end_of_text|>",
    ]
