"""Chat messages -> one prompt, with the model's own chat template.

The template is the `chat_template` of the export's tokenizer_config.json, rendered the way
transformers' `apply_chat_template` renders it (a sandboxed jinja2 environment with
trim_blocks / lstrip_blocks, `raise_exception`, `tojson`, the tokenizer's special tokens as
variables); a model without one gets ChatML. Generation stops at the template's end-of-turn
token.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from functools import lru_cache
from typing import Any

from kiln.serving.protocol import RequestError

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# markers templates use to close a turn (ChatML, Llama 3, Gemma, Phi-3, Llama 2)
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>")
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def load_chat_config(tokenizer_dir: str | None) -> tuple[str | None, dict[str, str]]:
    """(chat_template or None, special tokens by name) from tokenizer_config.json."""
    path = os.path.join(tokenizer_dir or "", "tokenizer_config.json")
    if not tokenizer_dir or not os.path.exists(path):
        return None, {}
    with open(path) as f:
        cfg = json.load(f)
    special = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[key] = value
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return (template if isinstance(template, str) else None), special


def end_of_turn_markers(template: str | None, special: dict[str, str]) -> list[str]:
    """The strings that close an assistant turn under this template."""
    source = template or CHATML
    found = [m for m in END_OF_TURN_MARKERS if m in source]
    eos = special.get("eos_token")
    if template is not None and eos and eos not in found:
        found.append(eos)
    return found


def _raise(message: str):
    raise RequestError(f"chat template: {message}", param="messages")


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
        x, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat(
    messages: list[dict[str, Any]],
    template: str | None,
    special: dict[str, str],
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for `messages` ([{role, content}]) under `template` (ChatML if None)."""
    from jinja2 import TemplateError

    try:
        return _compile(template or CHATML).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **special
        )
    except TemplateError as e:
        raise RequestError(f"chat template: {e}", param="messages") from None
