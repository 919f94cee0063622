"""`DocBatch`: the texts of one batch plus per-document statistics that filters share.

Statistics are computed lazily, once per batch, over flat Arrow/numpy arrays. Characters of
scripts written without spaces (CJK, kana, Thai) are one word each and everything else is split on
whitespace, so word-based rules treat Japanese technical prose (kana + `ls -l`) like English.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NO_SPACE_SCRIPTS = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}"
# One word per CJK/kana/Thai character (plus the prolonged-sound mark ー, script "Common"), with
# adjacent punctuation attached the way "word," stays one word in English.
_CHAR_WORD = rf"([^\s\pL\pN]*[{NO_SPACE_SCRIPTS}\x{{30FC}}\x{{FF70}}][^\s\pL\pN]*)"


def _np(arr) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


class Segments:
    """A flat array of pieces (words, lines, paragraphs) in document order.

    `doc[i]` is the document of piece i, `ids` a batch-wide integer id per distinct piece,
    `chars` its length, `lengths[d]` the number of pieces of document d. Words also carry
    `alpha` (has a letter) and `cjk` (is a CJK/kana/Thai character word)."""

    alpha: np.ndarray
    cjk: np.ndarray

    def __init__(self, doc: np.ndarray, ids: np.ndarray, chars: np.ndarray, n_docs: int):
        self.doc, self.ids, self.chars = doc, ids, chars
        self.lengths = np.bincount(doc, minlength=n_docs)

    @classmethod
    def from_lists(cls, lists: pa.Array, n_docs: int) -> Segments:
        """From an Arrow list<string> array (one list per document), dropping blank pieces."""
        values = pc.utf8_trim_whitespace(pc.list_flatten(lists))
        doc = np.repeat(np.arange(len(lists)), _np(pc.list_value_length(lists)))
        keep = _np(pc.not_equal(values, ""))
        values, doc = values.filter(pa.array(keep)), doc[keep]
        encoded = pc.dictionary_encode(values)
        ids = _np(encoded.indices).astype(np.int64)
        seg = cls(doc, ids, _np(pc.utf8_length(encoded.dictionary)).astype(np.int64)[ids], n_docs)
        seg.values, seg.distinct = values, encoded.dictionary
        return seg

    def matches(self, pattern: str) -> np.ndarray:
        """Per piece, whether it matches a regex (RE2), decided once per distinct piece: a
        batch's words repeat (`the`, `of`), so this runs on a small share of them."""
        return _np(pc.match_substring_regex(self.distinct, pattern))[self.ids]

    def per_doc(self, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(self.doc, weights=weights, minlength=len(self.lengths))


class DocBatch:
    """`segmenter` (a `JapaneseSegmenter`, filters.japanese_words: tokenizer) splits Japanese
    documents into the tokenizer's words instead of one word per character."""

    def __init__(
        self,
        texts: list[str],
        no_space_ratio: float = 0.3,
        urls: list[str | None] | None = None,
        segmenter=None,
    ):
        self.texts = texts
        self.urls = urls  # each document's URL (read.url_field), when the input has one
        self.arr = pa.array(texts, pa.large_string())
        self.no_space_ratio = no_space_ratio
        self.segmenter = segmenter

    def __len__(self) -> int:
        return len(self.texts)

    @cached_property
    def n_chars(self) -> np.ndarray:
        return _np(pc.utf8_length(self.arr)).astype(np.int64)

    def count(self, pattern: str) -> np.ndarray:
        """Regex (RE2) matches per document."""
        return _np(pc.count_substring_regex(self.arr, pattern)).astype(np.int64)

    def count_chars(self, char_class: str) -> np.ndarray:
        """Characters per document in a class given as the inside of [...] (deletes runs of the
        others, which is far cheaper than one regex match per character when most characters
        are in the class; for a class rare in every script, such as digits,
        `count(f"[{char_class}]")` gives the same count for less)."""
        kept = pc.replace_substring_regex(self.arr, f"[^{char_class}]+", "")
        return _np(pc.utf8_length(kept)).astype(np.int64)

    @cached_property
    def lower(self) -> pa.Array:
        return pc.utf8_lower(self.arr)

    @cached_property
    def no_space_chars(self) -> np.ndarray:
        """CJK/kana/Thai characters per document."""
        return self.count_chars(NO_SPACE_SCRIPTS)

    @cached_property
    def no_space(self) -> np.ndarray:
        """Documents in scripts written without spaces (CJK, kana, Thai)."""
        cjk = self.no_space_chars
        if self.no_space_ratio <= 0:
            return cjk >= 0
        # letters are only counted where there is a CJK character: the others are spaced (the
        # \pL count is the dearest regex of the batch and English has no use for it)
        out = np.zeros(len(self), dtype=bool)
        some = np.flatnonzero(cjk > 0)
        if len(some):
            kept = pc.replace_substring_regex(self.arr.take(some), r"[^\pL]+", "")
            letters = _np(pc.utf8_length(kept)).astype(np.int64)
            out[some] = cjk[some] >= self.no_space_ratio * np.maximum(letters, 1)
        return out

    @cached_property
    def segmented(self) -> np.ndarray:
        """Documents whose words come from the Japanese tokenizer: unspaced ones holding kana
        (Chinese, without kana, keeps one word per character), when a segmenter is set."""
        if self.segmenter is None:
            return np.zeros(len(self), dtype=bool)
        return self.no_space & (self.count(r"[\p{Hiragana}\p{Katakana}]") > 0)

    @cached_property
    def words(self) -> Segments:
        """Words: each CJK/kana/Thai character is one word, the rest is split on whitespace;
        Japanese documents' Japanese runs are the tokenizer's words (`segmented`).

        Splitting only on whitespace would make a Japanese sentence one "word"; counting every
        character of an unspaced document as a word made `ls`, `--help` and `foo_bar` many
        non-alphabetic "words" and rejected Japanese technical prose."""
        spaced = pc.replace_substring_regex(self.arr, _CHAR_WORD, r" \1 ")
        if self.segmented.any():
            split = [
                self.segmenter.split(t) if s else ""
                for t, s in zip(self.texts, self.segmented, strict=True)
            ]
            spaced = pc.if_else(
                pa.array(self.segmented), pa.array(split, pa.large_string()), spaced
            )
        seg = Segments.from_lists(pc.utf8_split_whitespace(spaced), len(self))
        seg.alpha = seg.matches(r"\pL")
        seg.cjk = seg.matches(f"[{NO_SPACE_SCRIPTS}]")
        return seg

    @cached_property
    def lines(self) -> Segments:
        return Segments.from_lists(pc.split_pattern(self.arr, "\n"), len(self))

    @cached_property
    def paragraphs(self) -> Segments:
        return Segments.from_lists(pc.split_pattern(self.arr, "\n\n"), len(self))

    @cached_property
    def n_words(self) -> np.ndarray:
        return self.words.lengths

    @cached_property
    def n_lines(self) -> np.ndarray:
        return self.lines.lengths

    def ratio(self, num: np.ndarray, den: np.ndarray) -> np.ndarray:
        return num / np.maximum(den, 1)

    def line_ratio(self, pattern: str) -> np.ndarray:
        """Fraction of a document's non-empty lines that match a regex."""
        hit = self.lines.matches(pattern)
        return self.ratio(self.lines.per_doc(hit.astype(np.float64)), self.n_lines)
