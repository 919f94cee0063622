"""Byte-level BPE: exact round trips (English, Japanese), CJK-aware pre-tokenisation, load/save."""

from __future__ import annotations

import pytest

from kiln.platform.errors import InputError
from kiln.text.tokenizer import EOD_TOKEN, eod_id, load_tokenizer
from kiln.training.data.tokenizer import new_bpe_tokenizer, save_tokenizer, train_tokenizer
from tests.training.data.corpus import ENGLISH, JAPANESE, documents


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(documents(200), vocab_size=600, special_tokens=[EOD_TOKEN, "<|pad|>"])


def test_special_tokens_come_first(tok):
    assert eod_id(tok) == 0
    assert tok.token_to_id("<|pad|>") == 1
    assert tok.get_vocab_size() <= 600


@pytest.mark.parametrize(
    "text",
    [
        *JAPANESE,
        *ENGLISH,
        "未知の漢字：鬱魑魅魍魎 と 絵文字 🍣🗻 と半角ｶﾀｶﾅ",  # unseen characters: bytes, never <unk>
        "  leading spaces, tabs\tand\nnewlines\r\n",
    ],
)
def test_round_trip_is_exact(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_japanese_is_split_by_script_not_swallowed_whole():
    pieces = [
        p
        for p, _ in new_bpe_tokenizer().pre_tokenizer.pre_tokenize_str("東京都に住んでいますHello")
    ]
    assert len(pieces) == 5  # 東京都 | に | 住 | んでいます | Hello


def test_japanese_compresses_after_training(tok):
    text = JAPANESE[0]
    assert len(tok.encode(text).ids) < len(text.encode("utf-8")) / 2


def test_save_and_load(tok, tmp_path):
    save_tokenizer(tok, tmp_path / "tk")
    again = load_tokenizer(tmp_path / "tk")
    assert again.encode(JAPANESE[1]).ids == tok.encode(JAPANESE[1]).ids
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "tk"))
    assert hf.eos_token == EOD_TOKEN
    assert hf.decode(hf.encode(JAPANESE[2])) == JAPANESE[2]
    with pytest.raises(InputError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "missing")
