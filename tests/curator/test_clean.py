"""Cleaning: ftfy repair (only where ftfy would change something), normalisation, control
characters, whitespace, C4 boilerplate lines."""

from __future__ import annotations

import random
import unicodedata

import ftfy

from kiln.curator.clean import Cleaner
from kiln.curator.config import CleanConfig
from tests.curator.prose import japanese, prose

ONLY_FTFY = CleanConfig(
    normalization="none",
    remove_control_chars=False,
    normalize_whitespace=False,
    boilerplate_lines=False,
)


def test_unicode_repair_equals_ftfy():
    rng = random.Random(0)
    samples = [
        "The Mona Lisa doesnâ€™t have eyebrows.",
        "cafÃ© au lait",
        "&lt;b&gt;bold&lt;/b&gt; text",
        "ﬁne ligatures",
        "ＦＵＬＬ　ｗｉｄｔｈ",
        "line\r\nbreaks\u2028here",
        "ｶﾀｶﾅ",
        "plain ascii text",
        "naïve résumé — “quotes”",
        japanese(rng),
        prose(rng),
    ]
    out = Cleaner(ONLY_FTFY)(samples)
    assert out == [ftfy.fix_text(s, normalization=None) for s in samples]
    assert out[0] == "The Mona Lisa doesn't have eyebrows."


def test_normalisation_control_chars_and_whitespace():
    text = "Cafe\u0301\x00 bell\x07 \u200bzero  \n\n\n\nnext   \t\nline\u00a0nbsp  "
    (nfc,) = Cleaner(CleanConfig())([text])
    assert nfc == "Café bell zero\n\nnext\nline nbsp"
    assert unicodedata.is_normalized("NFC", nfc)
    (nfkc,) = Cleaner(CleanConfig(normalization="NFKC"))(["ｱｲｳ ①"])
    assert nfkc == "アイウ 1"


def test_boilerplate_lines_are_removed():
    text = (
        "A real sentence.\nRead our Privacy Policy here\nThis site uses cookies to work.\n"
        "Another line."
    )
    (out,) = Cleaner(CleanConfig())([text])
    assert out == "A real sentence.\nAnother line."


def test_lone_surrogates_become_storable():
    (out,) = Cleaner(CleanConfig())(["bad \ud800 surrogate"])
    out.encode("utf-8")


def test_with_every_step_off_only_lone_surrogates_change():
    off = ONLY_FTFY.model_copy(update={"fix_unicode": False})
    texts = ["plain ascii\x00  \n\n\n", "naïve \ud800 half", "日本語\u3000テキスト \r\n"]
    out = Cleaner(off)(texts)
    assert out == [texts[0], "naïve ? half", texts[2]]
