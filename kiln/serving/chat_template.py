"""Chat messages -> one prompt, for the endpoint: the one renderer in kiln.training.post.

The template is the `chat_template` of the export's tokenizer_config.json, rendered the way
transformers' `apply_chat_template` renders it (see kiln/training/post/chat_template.py); a
model without one gets ChatML. Template errors become a 400 naming `messages`, and generation
stops at the template's end-of-turn token.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kiln.platform.errors import ConfigError
from kiln.serving.protocol import RequestError
from kiln.training.post.chat_template import CHATML, SPECIAL_TOKEN_NAMES, ChatTemplate, token_text

# markers templates use to close a turn (ChatML, Llama 3, Gemma, Phi-3, Llama 2)
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>")

__all__ = [
    "CHATML",
    "end_of_turn_markers",
    "load_chat_config",
    "render_chat",
    "triton_chat_config",
]


def load_chat_config(tokenizer_dir: str | None) -> tuple[str | None, dict[str, str]]:
    """(chat_template or None, special tokens by name) from tokenizer_config.json."""
    path = os.path.join(tokenizer_dir or "", "tokenizer_config.json")
    if not tokenizer_dir or not os.path.exists(path):
        return None, {}
    with open(path) as f:
        cfg = json.load(f)
    special = {k: t for k in SPECIAL_TOKEN_NAMES if (t := token_text(cfg.get(k))) is not None}
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


def render_chat(
    messages: list[dict[str, Any]],
    template: str | None,
    special: dict[str, str],
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for `messages` ([{role, content}]) under `template` (ChatML if None)."""
    from jinja2 import TemplateError

    try:
        return ChatTemplate(template or CHATML, special).render(
            messages, add_generation_prompt=add_generation_prompt
        )
    except (TemplateError, ConfigError) as e:
        raise RequestError(f"chat template: {e}", param="messages") from None


def triton_chat_config(config: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    """(chat_template or None, special tokens) from a Triton model config as JSON
    (`get_model_config(as_json=True)["config"]`): the parameters kiln's Triton export writes."""
    params = config.get("parameters") or {}

    def value(key: str) -> str:
        return str((params.get(key) or {}).get("string_value") or "")

    try:
        special = json.loads(value("special_tokens") or "{}")
    except ValueError:
        special = {}
    special = {k: v for k, v in special.items() if isinstance(v, str)}
    return value("chat_template") or None, special
