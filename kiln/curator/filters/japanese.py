"""Japanese words for the word-based filters: runs of Japanese script are split by MeCab
(fugashi) with the UniDic dictionary (unidic-lite), the `ja` extra.

Only the Japanese runs are handed to the tokenizer; Latin text inside a Japanese page (`ls -l`,
`--help`) stays split on whitespace as in English. A token without a letter or digit (`。`, `、`,
`「`) is attached to the word before it, the way "word," is one word in English, so punctuation
never counts as a non-alphabetic word."""

from __future__ import annotations

import re

from kiln.platform.extras import require_extra

JA_MODULES = ("fugashi", "unidic_lite")
_LETTERS = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_PUNCT = "\u3000-\u303f\uff01-\uff65"  # CJK punctuation, full-width forms
# a run holds Han or kana (ー, half-width katakana included); CJK punctuation alone (「 before
# `ls`) is no run and stays on its Latin word, as without the tokenizer
JAPANESE_RUN = re.compile(f"[{_PUNCT}]*[{_LETTERS}][{_LETTERS}{_PUNCT}]*")
_WORDLIKE = re.compile(r"[^\W_]")  # a letter or digit, any script


def require_segmenter() -> None:
    """MissingExtraError naming the `ja` extra when fugashi or unidic-lite is missing."""
    require_extra("ja", JA_MODULES, "filters.japanese_words: tokenizer")


class JapaneseSegmenter:
    """`split(text)`: the text with every Japanese run replaced by its words, space-separated."""

    def __init__(self) -> None:
        require_segmenter()
        import fugashi

        self.tagger = fugashi.Tagger()

    def words(self, run: str) -> list[str]:
        """The tokenizer's words of one Japanese run, punctuation attached to the word before."""
        out: list[str] = []
        opening = ""  # punctuation before the run's first word (「) goes onto that word
        for token in self.tagger(run):
            surface = token.surface
            if _WORDLIKE.search(surface):
                out.append(opening + surface)
                opening = ""
            elif out:
                out[-1] += surface
            else:
                opening += surface
        return out if not opening else [*out, opening]

    def split(self, text: str) -> str:
        return JAPANESE_RUN.sub(lambda m: " " + " ".join(self.words(m.group(0))) + " ", text)
