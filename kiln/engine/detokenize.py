"""Incremental detokenization: the text of a growing token list without decoding all of it at
every token (vLLM's and TGI's prefix/read offsets)."""

from __future__ import annotations

from collections.abc import Callable


class IncrementalText:
    """`update(ids)` returns decode(ids) for a list that only grows, decoding a few tokens per
    call: the text of the tokens since the last settled point, minus that of a short prefix
    (so leading-space rules of the tokenizer apply as in a full decode). A tail that decodes to
    U+FFFD (half a UTF-8 character) is held back until the rest arrives."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.text = ""  # settled text: decode(ids[:read])
        self.prefix = 0  # ids[prefix:read] give the context of the next piece
        self.read = 0

    def update(self, ids: list[int]) -> str:
        before = self.decode(ids[self.prefix : self.read])
        after = self.decode(ids[self.prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return self.text  # half a character, or nothing new yet
        if after.startswith(before):
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(ids)
        else:  # a tokenizer that rewrites earlier text: decode it all once
            self.text = self.decode(ids)
            self.prefix, self.read = max(len(ids) - 4, 0), len(ids)
        return self.text


def hold_back(text: str, stops: list[str]) -> str:
    """Withhold a tail that may still become a stop string, or is half a UTF-8 character."""
    text = text.rstrip("\ufffd")
    cut = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                cut = min(cut, len(text) - k)
                break
    return text[:cut]
