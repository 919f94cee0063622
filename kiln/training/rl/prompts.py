"""RL prompt datasets: JSONL / Parquet rows holding a `prompt` or `messages`, plus reward fields.

A row is `{"prompt": str, ...}` or `{"messages": [{"role", "content"}, ...], ...}`; every other
field (`answer`, `tests`, ...) is kept as is for the rewards, which receive the whole row.
Unlike SFT data, a bad row is an error, not a rejected line: a prompt set is small and hand-made,
and a silently shorter one changes what the run learns.
"""

from __future__ import annotations

import os
from typing import Literal

from kiln.platform.errors import InputError
from kiln.text.chat_template import ChatTemplate
from kiln.training.post.records import ROLES, BadRow, iter_rows

PromptFormat = Literal["chat", "raw"]


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRow("'messages' must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRow(f"messages[{i}] is not an object")
        if m.get("role") not in ROLES:
            raise BadRow(f"messages[{i}].role {m.get('role')!r} is not one of {list(ROLES)}")
        if not isinstance(m.get("content"), str):
            raise BadRow(f"messages[{i}].content must be a string")
    if messages[-1]["role"] == "assistant":
        raise BadRow("'messages' must end on a user (or system) turn: the model writes the reply")


def check_prompt_row(row) -> dict:
    """The row if it holds a usable prompt; BadRow with the reason otherwise."""
    if isinstance(row, BadRow):
        raise row
    if not isinstance(row, dict):
        raise BadRow("row is not an object")
    if "messages" in row and row["messages"] is not None:
        _check_messages(row["messages"])
    elif "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise BadRow("'prompt' must be a non-empty string")
    else:
        raise BadRow("expected a 'prompt' (string) or 'messages' (chat list) field")
    return row


def load_prompts(path: str | os.PathLike) -> list[dict]:
    """Every row of a .jsonl/.parquet file (or a directory of them), in order.

    Raises InputError naming the file and line of the first bad row."""
    rows = []
    for file, line, row in iter_rows(path):
        try:
            rows.append(check_prompt_row(row))
        except BadRow as e:
            raise InputError(f"{file}:{line}: {e}") from None
    if not rows:
        raise InputError(f"{path}: no prompt rows")
    return rows


def render_prompt(
    row: dict, chat_template: ChatTemplate | None, prompt_format: PromptFormat = "chat"
) -> str:
    """The text the policy continues.

    `messages` are rendered with the chat template and its generation prompt (a template is
    required). A plain `prompt` becomes one user message when there is a template and
    `prompt_format` is "chat"; it is used verbatim otherwise (base models, completion tasks)."""
    messages = row.get("messages")
    if messages is not None:
        if chat_template is None:
            raise InputError(
                "prompt row has 'messages' but the model has no chat template "
                "(set chat_template, or give a plain 'prompt')"
            )
        return chat_template.render(messages, add_generation_prompt=True)
    if chat_template is not None and prompt_format == "chat":
        return chat_template.render(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True
        )
    return row["prompt"]
