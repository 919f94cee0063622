"""Chat messages -> one prompt, for the endpoint, with kiln.text's one renderer.

The template is the `chat_template` of the export's tokenizer_config.json (or of a Triton
model's config), rendered the way transformers' `apply_chat_template` renders it; a model without
one gets ChatML. Template errors become a 400 naming `messages`.
"""

from __future__ import annotations

import json
from typing import Any

from kiln.platform.errors import ConfigError
from kiln.serving.api.protocol import RequestError
from kiln.text.chat_template import CHATML, ChatTemplate


def render_chat(
    messages: list[dict[str, Any]],
    template: str | None,
    special: dict[str, str],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt text for `messages` ([{role, content}]) under `template` (ChatML if None),
    with `tools` passed to the template as transformers passes them."""
    from jinja2 import TemplateError

    try:
        return ChatTemplate(template or CHATML, special).render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools
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
