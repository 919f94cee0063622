"""Conversations to token ids plus a loss mask (which tokens are trained on).

The ids are the tokenizer's encoding of the rendered conversation (what `apply_chat_template`
returns). An assistant turn's span in the text is found by rendering prefixes of the
conversation: it starts where `messages[:k]` with the generation prompt ends (the
`<|im_start|>assistant\\n` header is prompt, not target) and ends where `messages[:k+1]` ends,
less trailing whitespace (the end-of-turn token is trained on, so the model learns to stop).
A token is trained on when its characters overlap a trained span.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from kiln.text.chat_template import ChatTemplate
from kiln.training.post.records import BadRow, PreferencePair

LossMask = Literal["assistant", "last", "all"]


def _assistant_spans(
    template: ChatTemplate, messages: list[dict], text: str, first_turn: int
) -> list[tuple[int, int]]:
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant" or k < first_turn:
            continue
        head = template.render(messages[:k], add_generation_prompt=True)
        upto = template.render(messages[: k + 1])
        if not (text.startswith(upto) and upto.startswith(head)):
            raise BadRow(
                "the chat template does not render turns as prefixes of the conversation; "
                "use loss_mask: all"
            )
        end = len(upto.rstrip())
        if end > len(head):
            spans.append((len(head), end))
    return spans


def _mask_from_spans(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    mask = np.zeros(len(offsets), dtype=np.uint8)
    if not spans:
        return mask
    starts = np.array([o[0] for o in offsets])
    ends = np.array([o[1] for o in offsets])
    for lo, hi in spans:
        mask[(ends > lo) & (starts < hi)] = 1
    return mask


def encode_chat(
    template: ChatTemplate,
    tokenizer,
    messages: list[dict],
    loss_mask: LossMask = "assistant",
    first_turn: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(token ids int64, loss mask uint8) of one conversation ending on an assistant turn.

    `loss_mask`: "assistant" trains on every assistant turn from `first_turn` on, "last" on the
    final assistant turn only, "all" on every token.
    """
    text = template.render(messages)
    enc = tokenizer.encode(text, add_special_tokens=False)
    ids = np.asarray(enc.ids, dtype=np.int64)
    if loss_mask == "all":
        return ids, np.ones(len(ids), dtype=np.uint8)
    if loss_mask == "last":
        first_turn = len(messages) - 1
    spans = _assistant_spans(template, messages, text, first_turn)
    return ids, _mask_from_spans(enc.offsets, spans)


def encode_preference(
    template: ChatTemplate, tokenizer, pair: PreferencePair
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(chosen ids, mask), (rejected ids, mask): the prompt is context, the reply the target."""
    n = len(pair.prompt)
    chosen = encode_chat(template, tokenizer, pair.prompt + pair.chosen, "assistant", n)
    rejected = encode_chat(template, tokenizer, pair.prompt + pair.rejected, "assistant", n)
    return chosen, rejected
