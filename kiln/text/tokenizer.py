"""A model's tokenizer: finding and loading its `tokenizer.json` (Hugging Face `tokenizers`), the
files that travel with it, and its end-of-text token.

Two end-of-text questions have different answers: pretraining separates documents with
`<|endoftext|>` when the vocabulary has it (GPT-2, SmolLM2, Qwen, ...), while generation stops at
the tokenizer config's `eos_token` first (a chat model's end of turn may differ from its document
separator). `end_of_text` answers both from one list.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kiln.platform.errors import InputError

EOD_TOKEN = "<|endoftext|>"
# conventional end-of-text names, most common first (GPT-2/Qwen, Llama 2, Gemma, ..., Llama 3)
EOS_CANDIDATES = (EOD_TOKEN, "</s>", "<eos>", "<|eos|>", "<|end_of_text|>")
# what travels with a model's weights so it tokenizes (and renders chats) the same everywhere
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_file(path: str | os.PathLike) -> Path:
    """`path` itself, or the `tokenizer.json` of a Tokenizer artifact, a HF model folder, a
    `kiln import-hf` output or an ExportedModel artifact (`<path>/hf/tokenizer.json`)."""
    p = Path(path)
    if p.is_dir():
        p = next(
            (f for f in (p / "tokenizer.json", p / "hf" / "tokenizer.json") if f.is_file()),
            p / "tokenizer.json",
        )
    if not p.is_file():
        raise InputError(
            f"{path}: no tokenizer.json here (expected a file or a directory holding one)"
        )
    return p


def load_tokenizer(path: str | os.PathLike):
    """The `tokenizers.Tokenizer` of a tokenizer.json or a folder holding one."""
    from tokenizers import Tokenizer

    file = tokenizer_file(path)
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exceptions on bad files
        raise InputError(f"{file}: not a Hugging Face tokenizer.json ({e})") from None


def find_tokenizer(tokenizer, search: list[str]):
    """(tokenizers.Tokenizer, its folder or None) from a Tokenizer (returned as is), a
    tokenizer.json path, a folder, or None: the first of `search` holding a tokenizer.json."""
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer, None
    candidates = [os.fspath(tokenizer)] if tokenizer is not None else search
    for c in candidates:
        f = c if c.endswith(".json") else os.path.join(c, "tokenizer.json")
        if os.path.isfile(f):
            return load_tokenizer(f), os.path.dirname(f)
    raise InputError(f"no tokenizer.json found in {', '.join(candidates)} (pass a tokenizer)")


def config_eos_token(tok_dir: str | os.PathLike | None) -> str | None:
    """The `eos_token` of the tokenizer_config.json in `tok_dir`, if any."""
    config = Path(tok_dir) / "tokenizer_config.json" if tok_dir else None
    if config is None or not config.is_file():
        return None
    eos = json.loads(config.read_text()).get("eos_token")
    if isinstance(eos, dict):  # AddedToken serialised
        eos = eos.get("content")
    return eos or None


def end_of_text(
    tok, tok_dir: str | os.PathLike | None = None, *, document: bool = False
) -> str | None:
    """The end-of-text token in `tok`'s vocabulary: for generation (`document=False`) the
    config's `eos_token`, else a conventional name; for separating pretraining documents
    `<|endoftext|>`, else the config's `eos_token`. None when there is none."""
    eos = config_eos_token(tok_dir)
    names = [EOD_TOKEN, eos] if document else [eos, *EOS_CANDIDATES]
    return next((n for n in names if n and tok.token_to_id(n) is not None), None)


def end_of_text_ids(tok, tok_dir: str | os.PathLike | None = None) -> list[int]:
    """The token ids that end a generation (empty when the vocabulary has none)."""
    name = end_of_text(tok, tok_dir)
    return vocabulary_ids(tok, [name] if name is not None else [])


def vocabulary_ids(tok, names: list[str]) -> list[int]:
    """The ids of those of `names` that are tokens of `tok` (e.g. a template's end-of-turn
    markers), in order."""
    ids = (tok.token_to_id(name) for name in names)
    return [i for i in ids if i is not None]


def model_eod_token(path: str | os.PathLike) -> str:
    """The end-of-document token of a model's tokenizer (`end_of_text(document=True)`)."""
    file = tokenizer_file(path)
    eod = end_of_text(load_tokenizer(file), file.parent, document=True)
    if eod is None:
        eos = config_eos_token(file.parent)
        if eos:  # named by the config but not in the vocabulary: `eod_id` says so
            return eos
        raise InputError(f"{file}: no {EOD_TOKEN!r} token and no eos_token in its config")
    return eod


def eod_id(tok, eod_token: str = EOD_TOKEN) -> int:
    i = tok.token_to_id(eod_token)
    if i is None:
        raise InputError(f"tokenizer has no end-of-document token {eod_token!r}")
    return i
