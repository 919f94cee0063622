"""Byte-level BPE tokenizers with Hugging Face `tokenizers`: train one on a corpus and save it
(loading any model's tokenizer is kiln.text.tokenizer).

Byte level means every string round-trips exactly (no unknown token). The pre-tokenizer splits
text before BPE sees it, GPT-2 style, but also keeps runs of Han, Hiragana and Katakana apart:
Japanese has no spaces, so GPT-2's `\\p{L}+` would hand BPE a whole sentence as one "word".
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from kiln.text.tokenizer import EOD_TOKEN

# Contractions; non-CJK letters (with a leading space); Han / Hiragana / Katakana runs; numbers
# in groups of three; punctuation; newlines; other whitespace (GPT-2 / Llama-3 conventions).
PRETOKENIZE_PATTERN = (
    r"'(?i:[sdmt]|ll|ve|re)"
    r"| ?[\p{L}&&[^\p{Han}\p{Hiragana}\p{Katakana}]]+"
    r"|\p{Han}+|\p{Hiragana}+|[\p{Katakana}ー]+"
    r"| ?\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def new_bpe_tokenizer():
    """An untrained byte-level BPE tokenizer with the CJK-aware pre-tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: list[str] | None = None,
    min_frequency: int = 2,
    show_progress: bool = False,
):
    """Train byte-level BPE; special tokens get the first ids (the EOD token first by default)."""
    from tokenizers import pre_tokenizers, trainers

    special_tokens = list(special_tokens or [EOD_TOKEN])
    tok = new_bpe_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is unknown
        show_progress=show_progress,
    )
    tok.train_from_iterator(_non_empty(texts), trainer=trainer)
    return tok


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    for t in texts:
        if t:
            yield t


def save_tokenizer(
    tok, out_dir: str | os.PathLike, eod_token: str = EOD_TOKEN, source: Path | None = None
) -> Path:
    """`tokenizer.json` plus a `tokenizer_config.json`, so `transformers.AutoTokenizer` loads it.
    A loaded tokenizer's own config (`source` folder: special tokens, chat template) is kept."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    source_config = (source / "tokenizer_config.json") if source else None
    if source_config is not None and source_config.is_file():  # a model's: keep its template
        shutil.copy(source_config, out / "tokenizer_config.json")
        return out / "tokenizer.json"
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eod_token,
        "eos_token": eod_token,
        "unk_token": None,
        "model_max_length": 1 << 30,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out / "tokenizer.json"
