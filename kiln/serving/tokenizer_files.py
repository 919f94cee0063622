"""Finding and loading a model's `tokenizer.json` (generation and export both need it)."""

from __future__ import annotations

import os

from kiln.platform.errors import InputError


def load_tokenizer(tokenizer, search: list[str]):
    """(tokenizers.Tokenizer, its folder or None) from a Tokenizer (returned as is), a
    tokenizer.json path, a folder, or None: the first of `search` holding a tokenizer.json."""
    from tokenizers import Tokenizer

    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer, None
    candidates = [os.fspath(tokenizer)] if tokenizer is not None else search
    for c in candidates:
        f = c if c.endswith(".json") else os.path.join(c, "tokenizer.json")
        if os.path.isfile(f):
            return Tokenizer.from_file(f), os.path.dirname(f)
    raise InputError(f"no tokenizer.json found in {', '.join(candidates)} (pass a tokenizer)")
